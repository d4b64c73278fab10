//! Helpers shared by the integration tests: scratch folders on the real disk, a small
//! deterministic generator, a GGUF writer, the synthetic stage the profile tests read, a wait for
//! reads queued at the drive, a run of a test on every kernel level the CPU has, and a write over
//! a file as another program would make it.
#![allow(dead_code)]

pub mod gguf_writer;
pub mod plan_model;
pub mod profile_stage;

use std::path::{Path, PathBuf};

/// A fresh folder under the target dir (on the real disk, so O_DIRECT is exercised), removed at
/// the end of the test.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Dir {
        let d =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64: reproducible data without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A float in (-mag, mag), exactly representable in f32.
    pub fn float(&mut self, mag: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * mag
    }
}

/// Waits until `n` reads wait for a place in `q` (a guard against a hang, not a timing
/// assertion).
pub fn until_waiting(q: &trash_panda::io::ReadQueue, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while q.waiting() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} reads wait, not {n}",
            q.waiting()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Runs `body` once on every kernel level this CPU has, forced, so a machine with AVX-512 tests
/// the AVX2 and portable paths too; a failure names the level.
pub fn on_every_level(body: impl Fn()) {
    for level in trash_panda::dtype::supported_simd_levels() {
        let run = std::panic::AssertUnwindSafe(|| {
            trash_panda::dtype::with_simd_level(level, &body).unwrap()
        });
        if let Err(e) = std::panic::catch_unwind(run) {
            eprintln!("the failure above is on the {level} kernels");
            std::panic::resume_unwind(e);
        }
    }
}

/// Writes `bytes` at `at` into `path` in place, as another program writing over a checkpoint
/// would: same file, same length, other bytes, and a modification time two seconds on (which no
/// file system's clock confuses with the one before).
pub fn write_over(path: &Path, at: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};

    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
    let was = std::fs::metadata(path).unwrap().modified().unwrap();
    f.set_modified(was + std::time::Duration::from_secs(2))
        .unwrap();
}
