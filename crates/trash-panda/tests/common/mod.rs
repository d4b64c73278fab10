//! Helpers shared by the integration tests: scratch folders on the real disk, a small
//! deterministic generator, and the synthetic stage the profile tests read.
#![allow(dead_code)]

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
