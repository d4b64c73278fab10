//! Adapter files' tensor names and shapes, mapped onto a small model: the mapper may refuse any
//! of them, never panic.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use trash_panda::adapter::{map_adapter, LayerShape, MapOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // One tensor a line: its name, then its dimensions, separated by spaces.
    let mut tensors = Vec::new();
    let mut alphas = HashMap::new();
    for line in text.lines() {
        let mut words = line.split(' ');
        let Some(name) = words.next() else { continue };
        let shape: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
        alphas.insert(name.to_owned(), shape.first().copied().unwrap_or(1) as f64);
        tensors.push((name.to_owned(), shape));
    }
    let layers = [
        LayerShape {
            name: "blocks.0.attn.to_q".into(),
            weight: vec![64, 32],
        },
        LayerShape {
            name: "blocks.0.conv".into(),
            weight: vec![16, 8, 3, 3],
        },
        LayerShape {
            name: "blocks_0.attn".into(),
            weight: vec![8, 8],
        },
    ];
    for options in [
        MapOptions::default(),
        MapOptions {
            component: Some("unet".into()),
            use_rslora: true,
            ..MapOptions::default()
        },
    ] {
        let _ = map_adapter(&tensors, &alphas, &layers, &options);
    }
});
