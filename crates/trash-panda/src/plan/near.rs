//! The names nearest a prefix that matched nothing, for the errors that say "did you mean".

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let substitute = previous + usize::from(ca != b[j]);
            previous = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// Up to three candidates closest to `prefix`, each cut to as many segments as the prefix has,
/// so a block prefix is compared with block prefixes and not with whole tensor names.
pub(crate) fn near_names<'a>(
    prefix: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let segments = prefix.trim_end_matches('.').split('.').count();
    let mut cut: Vec<String> = candidates
        .map(|c| {
            let parts: Vec<&str> = c.split('.').collect();
            let mut s = parts[..segments.min(parts.len())].join(".");
            if parts.len() > segments {
                s.push('.');
            }
            s
        })
        .collect();
    cut.sort();
    cut.dedup();
    let mut ranked: Vec<(usize, String)> =
        cut.into_iter().map(|c| (distance(prefix, &c), c)).collect();
    ranked.sort();
    ranked.into_iter().take(3).map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_near_names() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "ab"), 2);
        let names = ["blocks.0.", "blocks.1.", "blocks.2.", "head."];
        let near = near_names("block.1.", names.iter().copied());
        assert_eq!(near[0], "blocks.1.");
        let tensors = ["model.layers.0.mlp.w", "model.layers.1.mlp.w"];
        assert_eq!(
            near_names("model.layer.0.", tensors.iter().copied())[0],
            "model.layers.0."
        );
    }
}
