//! Arbitrary bytes read as a whole GGUF file through the same reader `Checkpoint::open` uses
//! for `.gguf` files. The reader must never panic, and whatever it accepts must only point at
//! bytes inside the input: aligned, non-overlapping ranges of exactly `bytes_for(numel)` bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trash_panda::checkpoint::gguf::parse_gguf;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let g = match parse_gguf(data, len) {
        Ok(g) => g,
        Err(e) => {
            // Messages are built from the input; rendering one must not panic either.
            let _ = e.to_string();
            return;
        }
    };
    assert!(g.alignment.is_power_of_two() && g.data_start <= len);
    let mut ranges: Vec<(u64, u64)> = g
        .tensors
        .iter()
        .map(|t| {
            assert!(t.offset % g.alignment == 0, "{t:?}");
            assert!(t.start == g.data_start + t.offset && t.end() <= len, "{t:?}");
            let numel = t.ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            let numel = if t.ne.contains(&0) { Some(0) } else { numel };
            assert_eq!(numel.and_then(|n| t.dtype.bytes_for(n)), Some(t.nbytes), "{t:?}");
            (t.start, t.end())
        })
        .collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
});
