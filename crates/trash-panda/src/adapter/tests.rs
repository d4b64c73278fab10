use super::*;

fn layers() -> Vec<LayerShape> {
    vec![
        LayerShape {
            name: "down_blocks.0.attentions.0.to_q".into(),
            weight: vec![64, 32],
        },
        LayerShape {
            name: "down_blocks.0.conv".into(),
            weight: vec![16, 8, 3, 3],
        },
        LayerShape {
            name: "mid_block.proj_in".into(),
            weight: vec![64, 64],
        },
    ]
}

fn t(name: &str, shape: &[u64]) -> (String, Vec<u64>) {
    (name.to_owned(), shape.to_vec())
}

fn map(
    tensors: &[(String, Vec<u64>)],
    alphas: &[(&str, f64)],
    options: &MapOptions,
) -> Result<AdapterMap, AdapterError> {
    let alphas = alphas.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    map_adapter(tensors, &alphas, &layers(), options)
}

#[test]
fn names_are_read_in_every_naming() {
    let dotted = |p: &str| Target::Dotted(p.to_owned());
    let cases = [
        (
            "base_model.model.a.b.lora_A.weight",
            dotted("base_model.model.a.b"),
            Part::Down,
        ),
        ("a.b.lora_B.default.weight", dotted("a.b"), Part::Up),
        ("unet.a.b.lora.down.weight", dotted("unet.a.b"), Part::Down),
        ("a.b.lora_linear_layer.up.weight", dotted("a.b"), Part::Up),
        (
            "transformer.a.lora_down.weight",
            dotted("transformer.a"),
            Part::Down,
        ),
        ("a.alpha", dotted("a"), Part::Alpha),
    ];
    for (name, target, part) in cases {
        assert_eq!(
            read_name(name),
            Read::Part(AdapterName { target, part }),
            "{name}"
        );
    }
    let joined = |component, path: &str| Target::Joined {
        component,
        path: path.to_owned(),
    };
    let cases = [
        (
            "lora_unet_down_blocks_0_to_q.lora_up.weight",
            joined("unet", "down_blocks_0_to_q"),
            Part::Up,
        ),
        (
            "lora_te1_text_model_q_proj.alpha",
            joined("text_encoder", "text_model_q_proj"),
            Part::Alpha,
        ),
        (
            "lora_te2_x.lora_down.weight",
            joined("text_encoder_2", "x"),
            Part::Down,
        ),
        (
            "lora_te_x.hada_w2_b",
            joined("text_encoder", "x"),
            Part::HadaW2B,
        ),
        ("lora_unet_x.lokr_w1", joined("unet", "x"), Part::LokrW1),
        ("lora_unet_x.lokr_w2_a", joined("unet", "x"), Part::LokrW2A),
    ];
    for (name, target, part) in cases {
        assert_eq!(
            read_name(name),
            Read::Part(AdapterName { target, part }),
            "{name}"
        );
    }
    assert_eq!(read_name("model.layers.0.weight"), Read::Other);
    assert_eq!(read_name(".lora_A.weight"), Read::Other);
    assert!(matches!(
        read_name("lora_unet_x.lora_mid.weight"),
        Read::Unsupported(_)
    ));
    assert!(matches!(
        read_name("a.lora_magnitude_vector"),
        Read::Unsupported(_)
    ));
}

#[test]
fn a_peft_lora_maps_with_its_config_s_alpha() {
    let tensors = [
        t(
            "base_model.model.down_blocks.0.attentions.0.to_q.lora_A.weight",
            &[4, 32],
        ),
        t(
            "base_model.model.down_blocks.0.attentions.0.to_q.lora_B.weight",
            &[64, 4],
        ),
        t(
            "base_model.model.down_blocks.0.conv.lora_A.weight",
            &[4, 8, 3, 3],
        ),
        t(
            "base_model.model.down_blocks.0.conv.lora_B.weight",
            &[16, 4, 1, 1],
        ),
    ];
    let options = MapOptions {
        lora_alpha: Some(8.0),
        ..MapOptions::default()
    };
    let m = map(&tensors, &[], &options).unwrap();
    assert_eq!(m.layers.len(), 2);
    assert_eq!(m.layers[0].alpha, 8.0);
    // No lora_alpha: the scale is 1, and the alpha PEFT takes is the rank.
    let plain = map(&tensors, &[], &MapOptions::default()).unwrap();
    assert_eq!((plain.layers[0].scale, plain.layers[0].alpha), (1.0, 4.0));
    assert_eq!(m.layers[0].layer, "down_blocks.0.attentions.0.to_q");
    assert_eq!(
        (m.layers[0].kind, m.layers[0].rank, m.layers[0].scale),
        (AdapterKind::Lora, 4, 2.0)
    );
    assert_eq!(m.layers[1].layer, "down_blocks.0.conv");
    let rs = map(
        &tensors,
        &[],
        &MapOptions {
            use_rslora: true,
            ..options
        },
    )
    .unwrap();
    assert_eq!(rs.layers[0].scale, 4.0); // 8 / sqrt(4)
    assert_eq!(rs.layers[0].alpha, 8.0);
    // No alpha anywhere: a scale of 1.
    assert_eq!(
        map(&tensors, &[], &MapOptions::default()).unwrap().layers[0].scale,
        1.0
    );
}

#[test]
fn a_kohya_lora_maps_by_joined_names_and_skips_other_components() {
    let tensors = [
        t(
            "lora_unet_down_blocks_0_attentions_0_to_q.lora_down.weight",
            &[8, 32],
        ),
        t(
            "lora_unet_down_blocks_0_attentions_0_to_q.lora_up.weight",
            &[64, 8],
        ),
        t("lora_unet_down_blocks_0_attentions_0_to_q.alpha", &[]),
        t(
            "lora_te1_text_model_encoder_layers_0_q_proj.lora_down.weight",
            &[8, 32],
        ),
    ];
    let alphas = [("lora_unet_down_blocks_0_attentions_0_to_q.alpha", 4.0)];
    let options = MapOptions {
        component: Some("unet".into()),
        ..MapOptions::default()
    };
    let m = map(&tensors, &alphas, &options).unwrap();
    assert_eq!(m.layers.len(), 1);
    assert_eq!(m.layers[0].scale, 0.5);
    assert_eq!(m.layers[0].parts.len(), 3);
    assert_eq!(m.skipped, vec![tensors[3].0.clone()]);
    // The same file for the model alone (no component): the text encoder's key matches nothing.
    let err = map(&tensors, &alphas, &MapOptions::default()).unwrap_err();
    assert!(
        matches!(&err, AdapterError::NoLayer { target, .. } if target == "text_model_encoder_layers_0_q_proj"),
        "{err}"
    );
}

#[test]
fn a_diffusers_file_strips_its_component_and_skips_the_others() {
    let tensors = [
        t("unet.mid_block.proj_in.lora.down.weight", &[2, 64]),
        t("unet.mid_block.proj_in.lora.up.weight", &[64, 2]),
        t("text_encoder.text_model.q_proj.lora_A.weight", &[2, 64]),
    ];
    let options = MapOptions {
        component: Some("unet".into()),
        ..MapOptions::default()
    };
    let m = map(&tensors, &[], &options).unwrap();
    assert_eq!(m.layers[0].layer, "mid_block.proj_in");
    assert_eq!(m.skipped.len(), 1);
}

#[test]
fn a_key_that_matches_nothing_names_the_nearest_layers() {
    let tensors = [
        t("down_blocks.0.attentions.0.to_k.lora_A.weight", &[4, 32]),
        t("down_blocks.0.attentions.0.to_k.lora_B.weight", &[64, 4]),
    ];
    let err = map(&tensors, &[], &MapOptions::default()).unwrap_err();
    let AdapterError::NoLayer { key, nearest, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(key, &tensors[0].0);
    assert_eq!(nearest[0], "down_blocks.0.attentions.0.to_q");
    assert!(
        err.to_string()
            .contains("nearest: down_blocks.0.attentions.0.to_q"),
        "{err}"
    );
}

#[test]
fn shapes_that_do_not_fit_are_refused_naming_the_tensor() {
    let q = "down_blocks.0.attentions.0.to_q";
    let cases: [(&[u64], &[u64], &str); 4] = [
        (&[4, 31], &[64, 4], "lora_A"), // in does not match
        (&[4, 32], &[64, 5], "lora_B"), // rank mismatch
        (&[4, 32], &[63, 4], "lora_B"), // out does not match
        (&[0, 32], &[64, 0], "lora_A"), // rank 0
    ];
    for (down, up, bad) in cases {
        let tensors = [
            t(&format!("{q}.lora_A.weight"), down),
            t(&format!("{q}.lora_B.weight"), up),
        ];
        let err = map(&tensors, &[], &MapOptions::default()).unwrap_err();
        let AdapterError::Shape { key, .. } = &err else {
            panic!("{err}");
        };
        assert!(key.contains(bad), "{down:?} {up:?}: {err}");
    }
    // A conv's up matrix must be 1x1.
    let tensors = [
        t("down_blocks.0.conv.lora_A.weight", &[4, 8, 3, 3]),
        t("down_blocks.0.conv.lora_B.weight", &[16, 4, 3, 3]),
    ];
    assert!(matches!(
        map(&tensors, &[], &MapOptions::default()),
        Err(AdapterError::Shape { .. })
    ));
    // Half a LoRA.
    let tensors = [t(&format!("{q}.lora_A.weight"), &[4, 32])];
    assert!(matches!(
        map(&tensors, &[], &MapOptions::default()),
        Err(AdapterError::Incomplete { .. })
    ));
    // An alpha that is not one number.
    let tensors = [
        t(&format!("{q}.lora_A.weight"), &[4, 32]),
        t(&format!("{q}.lora_B.weight"), &[64, 4]),
        t(&format!("{q}.alpha"), &[2]),
    ];
    let alpha = format!("{q}.alpha");
    assert!(matches!(
        map(&tensors, &[(&alpha, 1.0)], &MapOptions::default()),
        Err(AdapterError::Alpha { .. })
    ));
    assert!(map(&tensors[..2], &[], &MapOptions::default()).is_ok());
}

#[test]
fn lokr_and_loha_are_checked_against_the_layer() {
    let q = "lora_unet_down_blocks_0_attentions_0_to_q";
    // 64 x 32 = kron([8, 4], [8, 8]), the second as [8, 2] @ [2, 8].
    let tensors = [
        t(&format!("{q}.lokr_w1"), &[8, 4]),
        t(&format!("{q}.lokr_w2_a"), &[8, 2]),
        t(&format!("{q}.lokr_w2_b"), &[2, 8]),
        t(&format!("{q}.alpha"), &[]),
    ];
    let alpha = format!("{q}.alpha");
    let m = map(&tensors, &[(&alpha, 1.0)], &MapOptions::default()).unwrap();
    assert_eq!(
        (m.layers[0].kind, m.layers[0].rank, m.layers[0].scale),
        (AdapterKind::Lokr, 2, 0.5)
    );
    let wrong = [
        t(&format!("{q}.lokr_w1"), &[8, 4]),
        t(&format!("{q}.lokr_w2"), &[8, 9]),
    ];
    assert!(matches!(
        map(&wrong, &[], &MapOptions::default()),
        Err(AdapterError::Shape { .. })
    ));
    let conv = "lora_unet_down_blocks_0_conv";
    let loha = [
        t(&format!("{conv}.hada_w1_a"), &[16, 4]),
        t(&format!("{conv}.hada_w1_b"), &[4, 72]),
        t(&format!("{conv}.hada_w2_a"), &[16, 4]),
        t(&format!("{conv}.hada_w2_b"), &[4, 72]),
    ];
    let m = map(&loha, &[], &MapOptions::default()).unwrap();
    assert_eq!((m.layers[0].kind, m.layers[0].rank), (AdapterKind::Loha, 4));
    let missing = &loha[..3];
    assert!(matches!(
        map(missing, &[], &MapOptions::default()),
        Err(AdapterError::Incomplete { .. })
    ));
}

#[test]
fn a_file_of_no_adapter_and_mixed_keys_are_refused() {
    let plain = [t("model.layers.0.weight", &[4, 4])];
    assert!(matches!(
        map(&plain, &[], &MapOptions::default()),
        Err(AdapterError::NotAnAdapter { .. })
    ));
    let q = "down_blocks.0.attentions.0.to_q";
    let mixed = [
        t(&format!("{q}.lora_A.weight"), &[4, 32]),
        t(
            "lora_unet_down_blocks_0_attentions_0_to_q.lora_down.weight",
            &[4, 32],
        ),
    ];
    assert!(matches!(
        map(&mixed, &[], &MapOptions::default()),
        Err(AdapterError::Duplicate { .. })
    ));
    let unsupported = [t(
        "lora_unet_down_blocks_0_conv.lora_mid.weight",
        &[4, 4, 3, 3],
    )];
    assert!(matches!(
        map(&unsupported, &[], &MapOptions::default()),
        Err(AdapterError::Unsupported { .. })
    ));
}
