//! Property tests of the parsers of what users type: sizes, dtype names, settings, plan JSON.

use proptest::prelude::*;
use trash_panda::plan::Plan;
use trash_panda::settings::{self, Source, SETTINGS};
use trash_panda::units::parse_bytes;
use trash_panda::DType;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn nothing_panics_on_any_text(text in ".{0,40}") {
        let _ = parse_bytes(&text);
        let _ = text.parse::<DType>();
        for s in SETTINGS {
            let _ = settings::parse(s, &text, Source::Environment);
        }
        let _ = Plan::from_json(&text);
    }

    #[test]
    fn plain_byte_counts_round_trip(n in 0u64..(1u64 << 53)) {
        prop_assert_eq!(parse_bytes(&n.to_string()).unwrap(), n);
        prop_assert_eq!(parse_bytes(&format!("  {n} B ")).unwrap(), n);
    }

    #[test]
    fn units_scale(whole in 0u64..100_000, frac in 0u32..1000, unit in prop::sample::select(vec![
        ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12),
        ("KiB", 1024.0), ("MiB", 1048576.0), ("GiB", 1073741824.0),
    ])) {
        let text = format!("{whole}.{frac:03}{}", unit.0);
        let value = (whole as f64 + f64::from(frac) / 1000.0) * unit.1;
        let got = parse_bytes(&text).unwrap() as f64;
        prop_assert!((got - value.round()).abs() <= 1.0, "{} -> {} (want {})", text, got, value);
        prop_assert_eq!(parse_bytes(&text.to_lowercase()).unwrap() as f64, got);
    }

    #[test]
    fn negative_and_unknown_are_errors_naming_the_value(n in 1u64..1_000_000, unit in "[a-df-zA-DF-Z]{1,3}") {
        let negative = format!("-{n}GB");
        let err = parse_bytes(&negative).unwrap_err().to_string();
        prop_assert!(err.contains(&negative), "{}", err);
        let odd = format!("{n}{unit}x");
        let err = parse_bytes(&odd).unwrap_err().to_string();
        prop_assert!(err.contains(&odd), "{}", err);
    }

    #[test]
    fn counts_and_switches(n in any::<u64>(), on in any::<bool>()) {
        let count = settings::find("lookahead").unwrap();
        prop_assert_eq!(settings::parse(count, &n.to_string(), Source::Argument).unwrap(), settings::Value::Count(n));
        let switch = settings::find("profile").unwrap();
        let word = if on { "YES" } else { "off" };
        prop_assert_eq!(settings::parse(switch, word, Source::Argument).unwrap(), settings::Value::Switch(on));
    }

    #[test]
    fn manual_plans_round_trip_through_json(names in prop::collection::btree_set("[a-z]{1,6}\\.[0-9]{1,2}\\.", 1..8), split in 0usize..8) {
        let names: Vec<String> = names.into_iter().collect();
        let split = split.min(names.len());
        if let Ok(plan) = Plan::manual(&names[..split], &names[split..], trash_panda::plan::Tier::Ram) {
            let back = Plan::from_json(&plan.to_json()).unwrap();
            prop_assert_eq!(back, plan);
        }
    }
}
