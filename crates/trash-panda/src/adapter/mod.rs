//! Adapters (LoRA, LoKr, LoHa) as users have them, mapped onto a model's layers.
//!
//! An adapter file is a safetensors file (read and checked as a checkpoint is) whose tensor names
//! say which layer each patches and which part of the patch it is, in one of three namings: PEFT
//! and diffusers (dotted module paths: `...q_proj.lora_A.weight`, `...to_q.lora.down.weight`),
//! kohya and ComfyUI (`lora_unet_down_blocks_0_..._to_q.lora_down.weight` with an `alpha`), and
//! LyCORIS (`lokr_w1`, `hada_w1_a`, ... under kohya's names). [`map_adapter`] reads every name,
//! finds each layer among the model's, checks every shape against its part and the layer, and
//! works out each layer's scale (alpha / rank, or alpha / sqrt(rank) with rsLoRA) before anything
//! is applied: a file that does not fit is refused whole, naming the tensor. [`choose_way`] says
//! whether a streamed layer runs its patch merged or beside its weight.

mod cost;
mod error;
mod names;

pub use cost::{
    choose_way, merge_cost, unmerged_cost, AdapterWay, LayerWork, WayChoice, TOUCH_COST,
};
pub use error::AdapterError;
pub use names::{read_name, AdapterName, Part, Read, Target};

use std::collections::{BTreeMap, HashMap};

use crate::plan::near::near_names;

/// The kind of patch a layer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    /// `ΔW = B A` (up x down).
    Lora,
    /// `ΔW = kron(W1, W2)`, each factor whole or as a product of two matrices.
    Lokr,
    /// `ΔW = (W1a W1b) ⊙ (W2a W2b)`.
    Loha,
}

impl AdapterKind {
    /// The kind's name (`lora`, `lokr`, `loha`).
    pub fn name(self) -> &'static str {
        match self {
            AdapterKind::Lora => "lora",
            AdapterKind::Lokr => "lokr",
            AdapterKind::Loha => "loha",
        }
    }
}

/// A layer of the model an adapter may patch: its name and its weight's shape (`[out, in]` for
/// a linear layer, `[out, in, kh, kw]` for a convolution).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerShape {
    /// The layer's module name in the model (`transformer_blocks.0.attn.to_q`).
    pub name: String,
    /// Its weight's shape.
    pub weight: Vec<u64>,
}

/// How to read a file against a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapOptions {
    /// The pipeline component the model is (`unet`, `transformer`, `text_encoder`, ...): the
    /// tensors of other components (a diffusers or kohya file holds a pipeline's) are skipped,
    /// not refused. `None`: every tensor is the model's.
    pub component: Option<String>,
    /// PEFT's `lora_alpha` (adapter_config.json) for layers whose file holds no alpha; `None`:
    /// the rank (a scale of 1).
    pub lora_alpha: Option<f64>,
    /// PEFT's `use_rslora`: scale by alpha / sqrt(rank) instead of alpha / rank.
    pub use_rslora: bool,
}

/// One layer's patch, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAdapter {
    /// The layer's module name in the model.
    pub layer: String,
    /// What kind of patch.
    pub kind: AdapterKind,
    /// Its rank (0 for a LoKr whose factors are both whole).
    pub rank: u64,
    /// What `ΔW` is multiplied by before the user's weight: alpha / rank (or / sqrt(rank)), 1
    /// where the file gives no alpha and no `lora_alpha` is set.
    pub scale: f64,
    /// The alpha that `scale` divides by the rank: the file's, or `lora_alpha`, or the rank
    /// itself where neither is given (0 with no rank). PEFT takes alpha and rank, not the scale,
    /// and computes `weight * alpha / rank` on each change of the user's weight.
    pub alpha: f64,
    /// The tensors of the file that make it, by part.
    pub parts: BTreeMap<Part, String>,
}

/// A file mapped onto a model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdapterMap {
    /// The layers it patches, in the order of the model's layers.
    pub layers: Vec<LayerAdapter>,
    /// Tensors for other components of the pipeline, left alone.
    pub skipped: Vec<String>,
}

/// Every component name a pipeline's adapter file may prefix a dotted name with.
const COMPONENTS: [&str; 8] = [
    "unet",
    "transformer",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "prior",
    "decoder",
    "vae",
];

/// Maps the file's tensors (`tensors`: name and shape) onto the model's `layers`. `alphas`: the
/// value of each alpha tensor the file has (scalar tensors the caller read), by name.
pub fn map_adapter(
    tensors: &[(String, Vec<u64>)],
    alphas: &HashMap<String, f64>,
    layers: &[LayerShape],
    options: &MapOptions,
) -> Result<AdapterMap, AdapterError> {
    let by_name: HashMap<&str, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i))
        .collect();
    let mut by_joined: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, l) in layers.iter().enumerate() {
        by_joined
            .entry(l.name.replace('.', "_"))
            .or_default()
            .push(i);
    }
    let shapes: HashMap<&str, &[u64]> = tensors
        .iter()
        .map(|(n, s)| (n.as_str(), s.as_slice()))
        .collect();

    let mut found: BTreeMap<usize, BTreeMap<Part, String>> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut any = false;
    for (key, _) in tensors {
        let name = match read_name(key) {
            Read::Part(name) => name,
            Read::Unsupported(what) => {
                return Err(AdapterError::Unsupported {
                    key: key.clone(),
                    what,
                })
            }
            Read::Other => continue,
        };
        any = true;
        let Some(layer) = find_layer(key, &name.target, &by_name, &by_joined, layers, options)?
        else {
            skipped.push(key.clone());
            continue;
        };
        let parts = found.entry(layer).or_default();
        if let Some(other) = parts.insert(name.part, key.clone()) {
            return Err(AdapterError::Duplicate {
                key: key.clone(),
                other,
                part: name.part.name(),
                layer: layers[layer].name.clone(),
            });
        }
    }
    if !any {
        return Err(AdapterError::NotAnAdapter {
            first: tensors.iter().take(3).map(|(n, _)| n.clone()).collect(),
        });
    }
    let mut out = Vec::with_capacity(found.len());
    for (layer, parts) in found {
        out.push(check_layer(
            &layers[layer],
            parts,
            &shapes,
            alphas,
            options,
        )?);
    }
    Ok(AdapterMap {
        layers: out,
        skipped,
    })
}

/// The model's layer `target` names, `None` when it belongs to another component.
fn find_layer(
    key: &str,
    target: &Target,
    by_name: &HashMap<&str, usize>,
    by_joined: &HashMap<String, Vec<usize>>,
    layers: &[LayerShape],
    options: &MapOptions,
) -> Result<Option<usize>, AdapterError> {
    let ours = |component: &str| options.component.as_deref().is_none_or(|c| c == component);
    match target {
        Target::Joined { component, path } => {
            if !ours(component) {
                return Ok(None);
            }
            match by_joined.get(path.as_str()).map(Vec::as_slice) {
                Some([one]) => Ok(Some(*one)),
                Some([first, second, ..]) => Err(AdapterError::Ambiguous {
                    key: key.to_owned(),
                    first: layers[*first].name.clone(),
                    second: layers[*second].name.clone(),
                }),
                _ => Err(no_layer(key, path, layers)),
            }
        }
        Target::Dotted(path) => {
            let path = path.strip_prefix("base_model.model.").unwrap_or(path);
            if let Some(&i) = by_name.get(path) {
                return Ok(Some(i));
            }
            let (first, rest) = path.split_once('.').unwrap_or((path, ""));
            if COMPONENTS.contains(&first) {
                if !ours(first) {
                    return Ok(None);
                }
                if let Some(&i) = by_name.get(rest) {
                    return Ok(Some(i));
                }
                return Err(no_layer(key, rest, layers));
            }
            Err(no_layer(key, path, layers))
        }
    }
}

fn no_layer(key: &str, target: &str, layers: &[LayerShape]) -> AdapterError {
    AdapterError::NoLayer {
        key: key.to_owned(),
        target: target.to_owned(),
        nearest: near_names(target, layers.iter().map(|l| l.name.as_str())),
    }
}

/// Checks one layer's parts against each other and the layer, and works out its scale.
fn check_layer(
    layer: &LayerShape,
    parts: BTreeMap<Part, String>,
    shapes: &HashMap<&str, &[u64]>,
    alphas: &HashMap<String, f64>,
    options: &MapOptions,
) -> Result<LayerAdapter, AdapterError> {
    let found = Found {
        layer: &layer.name,
        parts: &parts,
        shapes,
    };
    let has = |ps: &[Part]| ps.iter().any(|p| parts.contains_key(p));
    let kind = if has(&[Part::Down, Part::Up]) {
        AdapterKind::Lora
    } else if has(&[
        Part::LokrW1,
        Part::LokrW1A,
        Part::LokrW1B,
        Part::LokrW2,
        Part::LokrW2A,
        Part::LokrW2B,
    ]) {
        AdapterKind::Lokr
    } else if has(&[Part::HadaW1A, Part::HadaW1B, Part::HadaW2A, Part::HadaW2B]) {
        AdapterKind::Loha
    } else {
        return Err(AdapterError::Incomplete {
            layer: layer.name.clone(),
            has: "an alpha".into(),
            missing: "the matrices it scales",
        });
    };
    let w = &layer.weight;
    if w.len() < 2 {
        return Err(AdapterError::Shape {
            key: parts.values().next().cloned().unwrap_or_default(),
            found: w.clone(),
            expected: format!("layer {} to have a weight of 2 or 4 dimensions", layer.name),
        });
    }
    let (out, inp, kernel) = (w[0], w[1], &w[2..]);
    let rank = match kind {
        AdapterKind::Lora => {
            let (dk, down) = found.need(Part::Down)?;
            let (uk, up) = found.need(Part::Up)?;
            let rank = down.first().copied().unwrap_or(0);
            let down_ok =
                down.len() == w.len() && rank > 0 && down[1] == inp && &down[2..] == kernel;
            if !down_ok {
                return Err(bad(
                    dk,
                    down,
                    format!(
                        "[rank, {inp}{}] for layer {} {w:?}",
                        dims(kernel),
                        layer.name
                    ),
                ));
            }
            let ones = vec![1; kernel.len()];
            let up_ok = up.len() == w.len() && up[0] == out && up[1] == rank && up[2..] == ones[..];
            if !up_ok {
                return Err(bad(
                    uk,
                    up,
                    format!(
                        "[{out}, {rank}{}] for layer {} {w:?}",
                        dims(&ones),
                        layer.name
                    ),
                ));
            }
            rank
        }
        AdapterKind::Lokr => check_lokr(layer, &found)?,
        AdapterKind::Loha => check_loha(layer, &found)?,
    };
    let alpha = match parts.get(&Part::Alpha) {
        Some(key) => {
            let a = alphas
                .get(key)
                .copied()
                .ok_or_else(|| AdapterError::Alpha {
                    key: key.clone(),
                    found: "no value read".into(),
                })?;
            let one = shapes[key.as_str()].iter().all(|&d| d == 1);
            if !a.is_finite() || !one {
                return Err(AdapterError::Alpha {
                    key: key.clone(),
                    found: format!("{a} in shape {:?}", shapes[key.as_str()]),
                });
            }
            Some(a)
        }
        None => options.lora_alpha,
    };
    let (scale, alpha) = match (alpha, rank) {
        (_, 0) => (1.0, 0.0),
        (None, r) => (1.0, r as f64),
        (Some(a), r) if options.use_rslora => (a / (r as f64).sqrt(), a),
        (Some(a), r) => (a / r as f64, a),
    };
    Ok(LayerAdapter {
        layer: layer.name.clone(),
        kind,
        rank,
        scale,
        alpha,
        parts,
    })
}

fn dims(extra: &[u64]) -> String {
    extra.iter().map(|d| format!(", {d}")).collect()
}

fn bad(key: &str, found: &[u64], expected: String) -> AdapterError {
    AdapterError::Shape {
        key: key.to_owned(),
        found: found.to_vec(),
        expected,
    }
}

/// One layer's parts with their shapes, for the checks.
struct Found<'a> {
    layer: &'a str,
    parts: &'a BTreeMap<Part, String>,
    shapes: &'a HashMap<&'a str, &'a [u64]>,
}

impl<'a> Found<'a> {
    /// The tensor and shape of `part`, where the layer has it.
    fn get(&self, part: Part) -> Option<(&'a str, &'a [u64])> {
        self.parts
            .get(&part)
            .map(|k| (k.as_str(), self.shapes[k.as_str()]))
    }

    /// The tensor and shape of `part`, which the layer's adapter needs.
    fn need(&self, part: Part) -> Result<(&'a str, &'a [u64]), AdapterError> {
        self.get(part).ok_or_else(|| AdapterError::Incomplete {
            layer: self.layer.to_owned(),
            has: self.parts.values().cloned().collect::<Vec<_>>().join(", "),
            missing: part.name(),
        })
    }
}

/// A LoKr factor, whole or as a product: its shape (rows, cols) and the product's rank (0 when
/// whole).
fn lokr_factor(
    found: &Found<'_>,
    whole: Part,
    left: Part,
    right: Part,
) -> Result<(u64, u64, u64), AdapterError> {
    if let Some((k, s)) = found.get(whole) {
        if s.len() != 2 || s.contains(&0) {
            return Err(bad(k, s, format!("a 2-D {} factor", whole.name())));
        }
        return Ok((s[0], s[1], 0));
    }
    let (lk, l) = found.need(left)?;
    let (rk, r) = found.need(right)?;
    if l.len() != 2 || l.contains(&0) {
        return Err(bad(lk, l, format!("a 2-D {} matrix", left.name())));
    }
    if r.len() != 2 || r[0] != l[1] || r[1] == 0 {
        return Err(bad(
            rk,
            r,
            format!("[{}, cols] after {} {l:?}", l[1], left.name()),
        ));
    }
    Ok((l[0], r[1], l[1]))
}

fn check_lokr(layer: &LayerShape, found: &Found<'_>) -> Result<u64, AdapterError> {
    let (a, c, r1) = lokr_factor(found, Part::LokrW1, Part::LokrW1A, Part::LokrW1B)?;
    let (b, d, r2) = lokr_factor(found, Part::LokrW2, Part::LokrW2A, Part::LokrW2B)?;
    let w = &layer.weight;
    let flat_in = w[1..].iter().fold(1u64, |p, &d| p.saturating_mul(d));
    if a.checked_mul(b) != Some(w[0]) || c.checked_mul(d) != Some(flat_in) {
        let key = found.parts.values().next().cloned().unwrap_or_default();
        return Err(AdapterError::Shape {
            key,
            found: vec![a.saturating_mul(b), c.saturating_mul(d)],
            expected: format!(
                "kron(w1, w2) of layer {}'s shape {w:?} ([{}, {flat_in}] flat)",
                layer.name, w[0]
            ),
        });
    }
    // LyCORIS scales by alpha over the rank of the factor given as a product (the second's
    // first); both whole: no scaling.
    Ok(if r2 > 0 { r2 } else { r1 })
}

fn check_loha(layer: &LayerShape, found: &Found<'_>) -> Result<u64, AdapterError> {
    let w = &layer.weight;
    let flat_in = w[1..].iter().fold(1u64, |p, &d| p.saturating_mul(d));
    let mut rank = 0;
    for (left, right) in [
        (Part::HadaW1A, Part::HadaW1B),
        (Part::HadaW2A, Part::HadaW2B),
    ] {
        let (lk, l) = found.need(left)?;
        let (rk, r) = found.need(right)?;
        if l.len() != 2 || l[0] != w[0] || l[1] == 0 {
            return Err(bad(
                lk,
                l,
                format!("[{}, rank] for layer {} {w:?}", w[0], layer.name),
            ));
        }
        if r.len() != 2 || r[0] != l[1] || r[1] != flat_in {
            return Err(bad(
                rk,
                r,
                format!("[{}, {flat_in}] for layer {} {w:?}", l[1], layer.name),
            ));
        }
        if left == Part::HadaW1A {
            rank = l[1];
        }
    }
    Ok(rank)
}

#[cfg(test)]
mod tests;
