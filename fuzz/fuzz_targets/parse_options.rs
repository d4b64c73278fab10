//! The parsers of what users type: sizes ("9GB"), dtype names, settings values, and plan JSON.
//! None may panic, and a size that parses must format and parse back to within rounding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trash_panda::plan::Plan;
use trash_panda::settings;
use trash_panda::units::parse_bytes;
use trash_panda::DType;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(n) = parse_bytes(text) {
        assert_eq!(parse_bytes(&n.to_string()).ok(), Some(n));
    }
    let _ = text.parse::<DType>();
    for s in settings::SETTINGS {
        let _ = settings::parse(s, text, settings::Source::Argument);
    }
    if let Ok(plan) = Plan::from_json(text) {
        let again = Plan::from_json(&plan.to_json()).expect("a plan's own JSON reads back");
        assert_eq!(again, plan);
    }
});
