//! The trace file of a synthetic stage: the same 8 blocks and three passes as profile_stage.rs
//! (2 blocks on the device, 3 in RAM, 3 on disk; the first pass cold), read back as JSON.

mod common;

use common::profile_stage::{empty, stage};
use serde_json::Value;
use trash_panda::profile::{CopyRun, Tier};

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents")
}

fn slices<'a>(trace: &'a Value, cat: &str) -> Vec<&'a Value> {
    events(trace)
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == cat)
        .collect()
}

fn bounds(e: &Value) -> (f64, f64) {
    let ts = e["ts"].as_f64().unwrap();
    (ts, ts + e["dur"].as_f64().unwrap())
}

fn inside(child: &Value, parent: &Value) -> bool {
    let ((cs, ce), (ps, pe)) = (bounds(child), bounds(parent));
    child["tid"] == parent["tid"] && cs >= ps && ce <= pe + 1e-6
}

#[test]
fn trace_nests_passes_blocks_and_stalls() {
    let mut p = stage();
    // Two workers: the copies of blocks 5 and 6 overlap, so they take two lanes.
    for (block, start, end) in [(5, 103.0, 104.5), (6, 104.0, 107.0), (7, 107.0, 107.5)] {
        p.record_copy(CopyRun {
            block,
            start,
            end,
            bytes: 500_000_000,
            tier: Tier::Disk,
            worker: None,
            cold: false,
        })
        .unwrap();
    }
    let trace: Value = serde_json::from_str(&p.to_trace_json()).unwrap();
    let passes = slices(&trace, "pass");
    let blocks: Vec<&Value> = ["device", "ram", "disk"]
        .iter()
        .flat_map(|tier| slices(&trace, tier))
        .collect();
    let stalls = slices(&trace, "stall");
    let copies = slices(&trace, "copy");
    assert_eq!(passes.len(), 3);
    assert_eq!(blocks.len(), 24);
    // Cold pass: 6 staged and 5 gpu waits; each warm pass: 3 staged waits.
    assert_eq!(stalls.len(), 6 + 5 + 3 + 3);
    assert_eq!(stalls.iter().filter(|e| e["name"] == "gpu wait").count(), 5);
    assert_eq!(copies.len(), 3);
    assert_eq!(bounds(passes[0]), (0.0, 9_750_000.0));
    assert_eq!(passes[1]["args"]["blocks"], 8);
    for b in &blocks {
        assert_eq!(b["tid"], 1);
        assert_eq!(passes.iter().filter(|p| inside(b, p)).count(), 1, "{b}");
    }
    for s in &stalls {
        let parent: Vec<_> = blocks.iter().filter(|b| inside(s, b)).collect();
        assert_eq!(parent.len(), 1, "{s}");
        assert_eq!(parent[0]["args"]["block"], s["args"]["block"]);
    }
    // Block 6 of the cold pass runs from 6.25 s: staged wait from its start, then the gpu wait.
    let b6 = blocks
        .iter()
        .find(|b| b["name"] == "blocks.6" && b["args"]["pass"] == 1)
        .unwrap();
    assert_eq!(b6["args"]["tier"], "disk");
    assert_eq!(b6["args"]["bytes"], 500_000_000);
    let in_b6: Vec<_> = stalls.iter().filter(|s| inside(s, b6)).collect();
    assert_eq!(bounds(in_b6[0]), (6_250_000.0, 8_750_000.0));
    assert_eq!(bounds(in_b6[1]), (8_750_000.0, 8_950_000.0));
    let tids: Vec<u64> = copies.iter().map(|c| c["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids, vec![2, 3, 2]);
    assert_eq!(copies[1]["args"]["gbps"].as_f64().unwrap(), 0.5 / 3.0);
    let thread_names: Vec<&str> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        thread_names,
        vec!["main thread", "copies", "copies (lane 2)"]
    );
    for e in events(&trace) {
        assert_eq!(e["pid"], 1);
        assert!(e["name"].is_string() && e["cat"].is_string() && e["args"].is_object());
    }
}

#[test]
fn trace_of_an_empty_profile_is_valid() {
    let trace: Value = serde_json::from_str(&empty().to_trace_json()).unwrap();
    assert!(events(&trace).iter().all(|e| e["ph"] == "M"));
}

#[test]
fn trace_draws_each_workers_stagings_on_its_lane() {
    let mut p = stage();
    // Two workers staging ahead of the warm pass's disk blocks (5, 6, 7), one RAM block cold.
    for (block, worker, start, end, tier, cold) in [
        (5, 0, 103.0, 104.5, Tier::Disk, false),
        (6, 1, 104.0, 107.0, Tier::Disk, false),
        (7, 0, 104.5, 106.0, Tier::Disk, false),
        (3, 1, 107.0, 107.2, Tier::Ram, true),
    ] {
        p.record_copy(CopyRun {
            block,
            start,
            end,
            bytes: 500_000_000,
            tier,
            worker: Some(worker),
            cold,
        })
        .unwrap();
    }
    let trace: Value = serde_json::from_str(&p.to_trace_json()).unwrap();
    let copies = slices(&trace, "copy");
    assert_eq!(copies.len(), 4);
    let tids: Vec<u64> = copies.iter().map(|c| c["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids, vec![2, 3, 2, 3]);
    assert_eq!(copies[0]["args"]["worker"], 0);
    assert_eq!(copies[1]["args"]["from"], "disk");
    assert_eq!(copies[3]["args"]["from"], "ram (cold)");
    assert_eq!(copies[3]["name"], "blocks.3");
    let thread_names: Vec<&str> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(thread_names, vec!["main thread", "worker 1", "worker 2"]);
}
