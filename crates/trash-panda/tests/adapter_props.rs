//! Property tests of adapter files mapped onto a model: no name or shape makes the mapper panic,
//! and an adapter written in PEFT's or kohya's naming for any subset of a model's layers maps
//! back onto exactly those layers, with their ranks and scales.

use std::collections::HashMap;

use proptest::prelude::*;
use trash_panda::adapter::{
    map_adapter, read_name, AdapterError, AdapterKind, LayerShape, MapOptions,
};

/// Layer names of a few segments, none with an underscore (so kohya's joined form is one name).
fn layer_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set(
        prop::collection::vec(prop_oneof!["[a-z]{1,6}", "[0-9]{1,2}"], 1..5)
            .prop_map(|s| s.join(".")),
        1..12,
    )
    .prop_map(|s| s.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn nothing_panics_on_any_names_or_shapes(
        names in prop::collection::vec("[a-zA-Z0-9_.]{0,30}(\\.lora_A\\.weight|\\.lora_up\\.weight|\\.alpha|\\.lokr_w1|\\.hada_w2_b|)", 0..8),
        shapes in prop::collection::vec(prop::collection::vec(0u64..70, 0..5), 8),
        alpha in prop::num::f64::ANY,
    ) {
        let tensors: Vec<(String, Vec<u64>)> = names.iter().cloned().zip(shapes.iter().cloned()).collect();
        let alphas: HashMap<String, f64> = names.iter().map(|n| (n.clone(), alpha)).collect();
        let layers = vec![
            LayerShape { name: "a.b".into(), weight: vec![8, 4] },
            LayerShape { name: "c".into(), weight: vec![8, 4, 3, 3] },
            LayerShape { name: "d".into(), weight: vec![] },
        ];
        for n in &names {
            let _ = read_name(n);
        }
        let _ = map_adapter(&tensors, &alphas, &layers, &MapOptions::default());
        let _ = map_adapter(&tensors, &alphas, &layers, &MapOptions { component: Some("unet".into()), ..MapOptions::default() });
    }

    #[test]
    fn an_adapter_for_any_layers_maps_back_onto_them(
        names in layer_names(),
        picks in prop::collection::vec(any::<bool>(), 12),
        ranks in prop::collection::vec(1u64..9, 12),
        kohya in any::<bool>(),
        alpha in 1u32..64,
    ) {
        let layers: Vec<LayerShape> = names
            .iter()
            .enumerate()
            .map(|(i, n)| LayerShape { name: n.clone(), weight: vec![16 + i as u64, 8 + i as u64] })
            .collect();
        let mut tensors = Vec::new();
        let mut alphas = HashMap::new();
        let mut want = Vec::new();
        for (i, layer) in layers.iter().enumerate() {
            if !picks[i] {
                continue;
            }
            let (out, inp, r) = (layer.weight[0], layer.weight[1], ranks[i]);
            if kohya {
                let base = format!("lora_unet_{}", layer.name.replace('.', "_"));
                tensors.push((format!("{base}.lora_down.weight"), vec![r, inp]));
                tensors.push((format!("{base}.lora_up.weight"), vec![out, r]));
                tensors.push((format!("{base}.alpha"), vec![]));
                alphas.insert(format!("{base}.alpha"), f64::from(alpha));
            } else {
                let base = format!("base_model.model.{}", layer.name);
                tensors.push((format!("{base}.lora_A.weight"), vec![r, inp]));
                tensors.push((format!("{base}.lora_B.weight"), vec![out, r]));
            }
            want.push((layer.name.clone(), r));
        }
        let options = MapOptions { lora_alpha: Some(f64::from(alpha)), ..MapOptions::default() };
        let got = map_adapter(&tensors, &alphas, &layers, &options);
        if want.is_empty() {
            let refused = matches!(got, Err(AdapterError::NotAnAdapter { .. }));
            prop_assert!(refused);
            return Ok(());
        }
        let got = got.unwrap();
        prop_assert!(got.skipped.is_empty());
        let seen: Vec<(String, u64)> = got.layers.iter().map(|l| (l.layer.clone(), l.rank)).collect();
        prop_assert_eq!(seen, want);
        for l in &got.layers {
            prop_assert_eq!(l.kind, AdapterKind::Lora);
            prop_assert_eq!(l.scale, f64::from(alpha) / l.rank as f64);
        }
    }
}
