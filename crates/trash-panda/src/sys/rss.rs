//! The resident memory of this process, once or sampled on a thread to find the peak of a
//! window (a checkpoint load, or a forward pass's activations on the CPU).
//!
//! On Linux it reads `/proc/self/statm` (resident pages times the page size) rather than
//! `status`: it is one short line, cheap enough to read every millisecond. Windows gives the
//! working set, macOS the task's resident size.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::platform::RssSource;
use super::SysError;

/// Where the resident set size is read on Linux.
pub const STATM: &str = "/proc/self/statm";

/// The interval [`RssSampler::start`] is usually given: short enough to catch a peak that lasts
/// a few milliseconds, and a read of statm costs microseconds.
pub const DEFAULT_RSS_INTERVAL: Duration = Duration::from_millis(1);

/// The resident set size of this process, in bytes.
pub fn current_rss() -> Result<u64, SysError> {
    RssSource::open()?.read()
}

/// The private resident memory of this process in bytes: on Linux `RssAnon` (heap and
/// anonymous maps; a mapped checkpoint's pages are not in it), on Windows the private bytes
/// (commit charge), on macOS the resident size.
pub fn private_memory() -> Result<u64, SysError> {
    super::platform::private_bytes()
}

/// The value of field `field` (in kB) of a `/proc/<pid>/status` text, in bytes.
pub fn parse_status_kb(text: &str, field: &'static str, path: &Path) -> Result<u64, SysError> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .ok_or_else(|| SysError::MissingField {
            path: path.to_path_buf(),
            field,
        })?;
    let value = line.trim().trim_end_matches("kB").trim();
    let kb: u64 = value.parse().map_err(|_| SysError::Parse {
        path: path.to_path_buf(),
        field,
        value: value.to_owned(),
    })?;
    Ok(kb.saturating_mul(1024))
}

/// Resident bytes from the text of a statm file (`size resident shared ...`, in pages).
pub fn parse_statm(text: &str, path: &Path) -> Result<u64, SysError> {
    statm_pages(text, path, 1, "resident").map(|pages| pages.saturating_mul(page_size()))
}

/// Private resident bytes from the text of a statm file: `resident` less `shared` (the pages a
/// file or shared memory backs), which is `RssAnon`, read as cheaply as the resident set.
pub fn parse_statm_private(text: &str, path: &Path) -> Result<u64, SysError> {
    let resident = statm_pages(text, path, 1, "resident")?;
    let shared = statm_pages(text, path, 2, "shared")?;
    Ok(resident.saturating_sub(shared).saturating_mul(page_size()))
}

fn statm_pages(text: &str, path: &Path, at: usize, field: &'static str) -> Result<u64, SysError> {
    let value = text
        .split_ascii_whitespace()
        .nth(at)
        .ok_or_else(|| SysError::MissingField {
            path: path.to_path_buf(),
            field,
        })?;
    value.parse().map_err(|_| SysError::Parse {
        path: path.to_path_buf(),
        field,
        value: value.to_owned(),
    })
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| crate::io::page_size() as u64)
}

/// What an [`RssSampler`] saw, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RssStats {
    /// When the sampler started.
    pub start: u64,
    /// The largest sample, `start` and `end` included.
    pub peak: u64,
    /// When it stopped.
    pub end: u64,
    /// Samples taken, `start` and `end` included.
    pub samples: u64,
}

impl RssStats {
    /// How far the peak rose above the start: the memory the window needed at most.
    pub fn rise(&self) -> u64 {
        self.peak.saturating_sub(self.start)
    }
}

/// What an [`RssSampler`] samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RssMeasure {
    /// The resident set: everything the process has in RAM, mapped files' pages included.
    Resident,
    /// The private resident memory (see [`private_memory`]): what the process allocated, not
    /// the pages of a mapped checkpoint it touched, which the system can drop at any time.
    Private,
}

/// Samples the resident set size (or the private memory) on its own thread and keeps the peak.
/// Dropping it stops and joins the thread.
#[derive(Debug)]
pub struct RssSampler {
    shared: Arc<Sampled>,
    start: u64,
    handle: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Sampled {
    stop: AtomicBool,
    peak: AtomicU64,
    samples: AtomicU64,
    source: RssSource,
    measure: RssMeasure,
}

impl Sampled {
    fn read(&self) -> Result<u64, SysError> {
        match self.measure {
            RssMeasure::Resident => self.source.read(),
            RssMeasure::Private => self.source.read_private(),
        }
    }

    fn sample(&self) -> Option<u64> {
        let rss = self.read().ok()?;
        self.peak.fetch_max(rss, Ordering::Relaxed);
        self.samples.fetch_add(1, Ordering::Relaxed);
        Some(rss)
    }
}

impl RssSampler {
    /// Takes a first sample of the resident set and starts sampling every `interval` (at least
    /// a microsecond).
    pub fn start(interval: Duration) -> Result<RssSampler, SysError> {
        RssSampler::start_measuring(interval, RssMeasure::Resident)
    }

    /// As [`start`](Self::start), sampling `measure`.
    pub fn start_measuring(
        interval: Duration,
        measure: RssMeasure,
    ) -> Result<RssSampler, SysError> {
        let mut shared = Sampled {
            stop: AtomicBool::new(false),
            peak: AtomicU64::new(0),
            samples: AtomicU64::new(1),
            source: RssSource::open()?,
            measure,
        };
        let start = shared.read()?;
        shared.peak = AtomicU64::new(start);
        let shared = Arc::new(shared);
        let interval = interval.max(Duration::from_micros(1));
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("tp-rss".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) {
                    // A failed read is a lost sample, not a reason to stop watching.
                    let _ = s.sample();
                    // Parked rather than slept, so stop() does not wait out a long interval.
                    std::thread::park_timeout(interval);
                }
            })
            .map_err(|source| SysError::Thread {
                what: "RSS sampler",
                source,
            })?;
        Ok(RssSampler {
            shared,
            start,
            handle: Some(handle),
        })
    }

    /// The largest resident size seen so far, now included.
    pub fn peak(&self) -> u64 {
        let _ = self.shared.sample();
        self.shared.peak.load(Ordering::Relaxed)
    }

    /// Stops sampling, takes a last sample, and returns what was seen.
    pub fn stop(mut self) -> RssStats {
        self.join();
        let end = self.shared.sample().unwrap_or(self.start);
        let peak = self.shared.peak.load(Ordering::Relaxed).max(end);
        RssStats {
            start: self.start,
            peak,
            end,
            samples: self.shared.samples.load(Ordering::Relaxed),
        }
    }

    fn join(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::Relaxed);
        handle.thread().unpark();
        // The loop cannot panic short of a bug in std; there is nothing to report either way.
        let _ = handle.join();
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn status_fields_parse_in_bytes_and_name_what_is_missing() {
        let text = "Name:\tpython\nRssAnon:\t  123456 kB\nRssFile:\t 10 kB\n";
        let p = Path::new("/proc/self/status");
        assert_eq!(parse_status_kb(text, "RssAnon", p).unwrap(), 123456 * 1024);
        assert_eq!(parse_status_kb(text, "RssFile", p).unwrap(), 10 * 1024);
        let e = parse_status_kb(text, "RssShmem", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("RssShmem") && e.contains("status"), "{e}");
        let private = private_memory().unwrap();
        assert!(private > 0 && private <= current_rss().unwrap() + (64 << 20));
    }

    #[test]
    fn current_rss_is_plausible_and_parsing_names_the_file() {
        let rss = current_rss().unwrap();
        assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
        let p = Path::new("/x/statm");
        assert_eq!(parse_statm("10 3 1 0 0 0 0\n", p).unwrap(), 3 * page_size());
        let e = parse_statm("10", p).unwrap_err().to_string();
        assert!(e.contains("/x/statm") && e.contains("resident"), "{e}");
        let e = parse_statm("10 x3", p).unwrap_err().to_string();
        assert!(e.contains("/x/statm") && e.contains("x3"), "{e}");
        assert_eq!(
            parse_statm_private("10 7 3 0 0 0 0\n", p).unwrap(),
            4 * page_size()
        );
        let e = parse_statm_private("10 7", p).unwrap_err().to_string();
        assert!(e.contains("/x/statm") && e.contains("shared"), "{e}");
    }

    #[test]
    fn a_touched_allocation_raises_the_peak() {
        const SIZE: usize = 200 << 20;
        let sampler = RssSampler::start(DEFAULT_RSS_INTERVAL).unwrap();
        // A non-zero fill writes every page; zeroed memory would stay untouched and not resident.
        let block = std::hint::black_box(vec![1u8; SIZE]);
        // Held a few intervals, then freed (unmapped: far above the mmap threshold), so only the
        // sampling thread can have seen the peak.
        std::thread::sleep(Duration::from_millis(10));
        drop(block);
        let stats = sampler.stop();
        // Tests of this crate run in parallel in one process and allocate and free meanwhile
        // (tens of MB), so the bounds keep that much room.
        assert!(stats.rise() >= (SIZE * 3 / 4) as u64, "{stats:?}");
        assert!(
            stats.end + ((SIZE / 2) as u64) < stats.peak,
            "freed: {stats:?}"
        );
        assert!(stats.peak >= stats.end && stats.peak >= stats.start);
        assert!(stats.samples >= 3, "{stats:?}");
    }

    #[test]
    fn stop_and_drop_return_promptly_even_with_a_long_interval() {
        let sampler = RssSampler::start(Duration::from_secs(3600)).unwrap();
        let t = Instant::now();
        let stats = sampler.stop();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(stats.samples >= 2 && stats.start > 0 && stats.end > 0);

        let sampler = RssSampler::start(Duration::from_secs(3600)).unwrap();
        assert!(sampler.peak() > 0);
        let t = Instant::now();
        drop(sampler);
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
