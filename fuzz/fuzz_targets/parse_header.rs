//! Arbitrary bytes read as a whole safetensors file (length field, header, data) through the same
//! reader `Checkpoint::open` uses. The reader must never panic, and whatever it accepts must only
//! point at bytes inside the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trash_panda::checkpoint::read_header;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(fh) = read_header(data, len) else {
        return;
    };
    assert_eq!(fh.data_start.checked_add(fh.data_len), Some(len));
    let mut ranges: Vec<(u64, u64)> = fh
        .header
        .entries
        .iter()
        .map(|e| {
            assert!(e.begin <= e.end && e.end <= fh.data_len, "{e:?}");
            (e.begin, e.end)
        })
        .collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
});
