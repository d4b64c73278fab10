//! A Chrome trace-event file (the JSON Object Format read by chrome://tracing and Perfetto): a
//! static picture of a stage. The main thread's track nests pass > block run > waits, so a stall
//! shows as a coloured slice inside the block that waited; the copies' tracks show when workers
//! moved which block from which tier, next to the compute they overlap.

use serde::Serialize;
use serde_json::{json, Value};

use super::{CopyRun, Profile};

const PID: u32 = 1;
const MAIN_TID: u32 = 1;
/// Copies go on lanes from this thread id upwards (one per engine worker, or more where copies
/// overlap), since trace viewers only draw properly nested slices on one thread.
const FIRST_COPY_TID: u32 = 2;

#[derive(Serialize)]
struct Event {
    name: String,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    /// A colour name of the legacy viewer; Perfetto ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    cname: Option<&'static str>,
    args: Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Trace {
    trace_events: Vec<Event>,
    display_time_unit: &'static str,
}

/// Times become whole nanoseconds from the earliest event before they become microseconds, so a
/// child slice computed from its parent's numbers can never poke out of it through rounding.
struct Clock {
    origin: f64,
}

impl Clock {
    fn ns(&self, t: f64) -> i64 {
        ((t - self.origin) * 1e9).round() as i64
    }
}

fn span(
    name: String,
    cat: &'static str,
    tid: u32,
    start_ns: i64,
    end_ns: i64,
    args: Value,
) -> Event {
    Event {
        name,
        cat,
        ph: "X",
        ts: start_ns as f64 / 1e3,
        dur: Some((end_ns - start_ns) as f64 / 1e3),
        pid: PID,
        tid,
        cname: None,
        args,
    }
}

fn metadata(name: &'static str, tid: u32, args: Value) -> Event {
    Event {
        name: name.to_string(),
        cat: "__metadata",
        ph: "M",
        ts: 0.0,
        dur: None,
        pid: PID,
        tid,
        cname: None,
        args,
    }
}

/// Assigns each copy the first lane free at its start; returns the lane of each copy, in the
/// order of `copies`.
pub(crate) fn copy_lanes(copies: &[CopyRun]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..copies.len()).collect();
    order.sort_by(|&a, &b| copies[a].start.total_cmp(&copies[b].start).then(a.cmp(&b)));
    let mut lane_end: Vec<f64> = Vec::new();
    let mut lanes = vec![0; copies.len()];
    for i in order {
        let c = &copies[i];
        let lane = match lane_end.iter().position(|&end| end <= c.start) {
            Some(lane) => lane,
            None => {
                lane_end.push(f64::NEG_INFINITY);
                lane_end.len() - 1
            }
        };
        lane_end[lane] = c.end;
        lanes[i] = lane;
    }
    lanes
}

/// The copy tracks: one per engine worker (a worker copies one block at a time), in worker order,
/// then lanes for copies that name no worker; a worker's copies that overlap (they should not)
/// spill onto lanes of their own rather than break the nesting. Returns each track's name and
/// the track of each copy, in the order of `copies`.
pub(crate) fn copy_tracks(copies: &[CopyRun]) -> (Vec<String>, Vec<usize>) {
    let mut groups: Vec<Option<usize>> = copies.iter().map(|c| c.worker).collect();
    groups.sort_by_key(|g| (g.is_none(), *g));
    groups.dedup();
    let (mut names, mut tracks) = (Vec::new(), vec![0; copies.len()]);
    for group in groups {
        let members: Vec<usize> = (0..copies.len())
            .filter(|&i| copies[i].worker == group)
            .collect();
        let picked: Vec<CopyRun> = members.iter().map(|&i| copies[i]).collect();
        let lanes = copy_lanes(&picked);
        let base = names.len();
        let count = lanes.iter().max().map_or(0, |&l| l + 1);
        names.extend((0..count).map(|lane| {
            let name = match group {
                Some(w) => format!("worker {}", w + 1),
                None => "copies".to_string(),
            };
            match lane {
                0 => name,
                _ => format!("{name} (lane {})", lane + 1),
            }
        }));
        for (i, lane) in members.into_iter().zip(lanes) {
            tracks[i] = base + lane;
        }
    }
    (names, tracks)
}

impl Profile {
    /// The trace as `{"traceEvents":[...]}`. Timestamps count from the earliest event recorded.
    pub fn to_trace_json(&self) -> String {
        let starts = self.runs().flatten().map(|r| r.start);
        let origin = starts
            .chain(self.copies.iter().map(|c| c.start))
            .fold(f64::INFINITY, f64::min);
        let clock = Clock {
            origin: if origin.is_finite() { origin } else { 0.0 },
        };
        let mut events = vec![
            metadata("process_name", MAIN_TID, json!({ "name": "trash-panda" })),
            metadata("thread_name", MAIN_TID, json!({ "name": "main thread" })),
            metadata("thread_sort_index", MAIN_TID, json!({ "sort_index": 0 })),
        ];
        for (pass, stats) in self.runs().zip(self.passes()) {
            let end = stats.start + stats.seconds;
            events.push(span(
                format!("pass {}", stats.index + 1),
                "pass",
                MAIN_TID,
                clock.ns(stats.start),
                clock.ns(end),
                serde_json::to_value(stats).unwrap_or(Value::Null),
            ));
            for run in pass {
                let (start, end) = (clock.ns(run.start), clock.ns(run.end));
                events.push(span(
                    self.names[run.block].clone(),
                    run.tier.name(),
                    MAIN_TID,
                    start,
                    end,
                    json!({
                        "block": run.block,
                        "tier": run.tier,
                        "pass": stats.index + 1,
                        "bytes": run.bytes,
                        "staged_wait_s": run.staged_wait,
                        "gpu_wait_s": run.gpu_wait,
                        "rest_s": run.rest(),
                    }),
                ));
                // The hook waits for the staged bytes first, then for the device copy.
                let staged_end = (start + (run.staged_wait * 1e9).round() as i64).min(end);
                let gpu_end = (staged_end + (run.gpu_wait * 1e9).round() as i64).min(end);
                for (name, from, to, cname) in [
                    ("staged wait", start, staged_end, "terrible"),
                    ("gpu wait", staged_end, gpu_end, "bad"),
                ] {
                    if to > from {
                        let mut e = span(
                            name.to_string(),
                            "stall",
                            MAIN_TID,
                            from,
                            to,
                            json!({ "block": run.block }),
                        );
                        e.cname = Some(cname);
                        events.push(e);
                    }
                }
            }
        }
        let (names, tracks) = copy_tracks(&self.copies);
        for (i, name) in names.into_iter().enumerate() {
            let tid = FIRST_COPY_TID + i as u32;
            events.push(metadata("thread_name", tid, json!({ "name": name })));
            events.push(metadata(
                "thread_sort_index",
                tid,
                json!({ "sort_index": tid }),
            ));
        }
        for (copy, track) in self.copies.iter().zip(tracks) {
            let from = match (copy.tier, copy.cold) {
                (super::Tier::Ram, true) => "ram (cold)",
                (super::Tier::Ram, false) => "ram",
                (tier, _) => tier.name(),
            };
            events.push(span(
                self.names[copy.block].clone(),
                "copy",
                FIRST_COPY_TID + track as u32,
                clock.ns(copy.start),
                clock.ns(copy.end),
                json!({
                    "block": copy.block,
                    "tier": copy.tier,
                    "from": from,
                    "cold": copy.cold,
                    "worker": copy.worker,
                    "bytes": copy.bytes,
                    "gbps": super::passes::gbps(copy.bytes, copy.end - copy.start),
                }),
            ));
        }
        let trace = Trace {
            trace_events: events,
            display_time_unit: "ms",
        };
        serde_json::to_string(&trace).unwrap_or_default()
    }
}
