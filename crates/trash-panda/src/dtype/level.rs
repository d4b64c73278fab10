//! Which instruction-set level the conversion kernels run: what the CPU supports, what
//! `TRASH_PANDA_SIMD` asks for, what a test or benchmark forces on its thread, and
//! [`multiversion!`], which compiles a loop once per level and runs the one chosen. The loops
//! themselves live above this file (`convert.rs`, the `avx2` and `neon` kernels) and ask it for
//! the level per call.

use super::DtypeError;
use crate::settings;
use std::cell::Cell;
use std::sync::OnceLock;

/// An instruction-set level the kernels are compiled for. Every level gives the same bits; they
/// differ only in speed, which is why tests and benchmarks can force one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Plain Rust, whatever the target's baseline vectorizes (SSE2 on x86-64, NEON on aarch64).
    Portable,
    /// x86-64 with AVX2, FMA and F16C (every AVX2 CPU has the last two).
    Avx2,
    /// x86-64 with AVX-512 F, BW and VL (and AVX2, FMA).
    Avx512,
    /// aarch64 with NEON (every Apple Silicon and Graviton CPU): the hand-written kernels of
    /// `dtype/neon` for fp8, bf16 and f16, the portable loops for the rest.
    Neon,
}

/// The values `TRASH_PANDA_SIMD` accepts (the settings table owns them: it sits below dtype).
pub use crate::settings::SIMD_CHOICES;

impl SimdLevel {
    /// Every level, each architecture's slowest first (a CPU has the portable one and those of
    /// its own architecture only).
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Portable,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Neon,
    ];

    /// The name `TRASH_PANDA_SIMD` uses.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        }
    }

    /// Whether this CPU runs the level's code.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_supported()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            // Each architecture's levels are unsupported on the others.
            _ => false,
        }
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The levels this CPU runs, slowest first: what a test loops over.
pub fn supported_simd_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| l.is_supported())
        .collect()
}

/// The fastest level this CPU runs: what `auto` picks.
pub fn best_simd_level() -> SimdLevel {
    static BEST: OnceLock<SimdLevel> = OnceLock::new();
    *BEST.get_or_init(|| supported_simd_levels().pop().unwrap_or(SimdLevel::Portable))
}

/// Parses a `TRASH_PANDA_SIMD` value (`None`: unset) into the level to run.
pub(crate) fn level_from_setting(raw: Option<&str>) -> Result<SimdLevel, DtypeError> {
    let value = settings::resolve("simd", None, |_| raw.map(str::to_owned))
        .map_err(|e| DtypeError::SimdSetting(e.to_string()))?;
    let word = value.to_string();
    let Some(level) = SimdLevel::ALL.into_iter().find(|l| l.name() == word) else {
        return Ok(best_simd_level());
    };
    checked(level, "environment variable TRASH_PANDA_SIMD")
}

fn checked(level: SimdLevel, origin: &'static str) -> Result<SimdLevel, DtypeError> {
    if level.is_supported() {
        Ok(level)
    } else {
        let names: Vec<_> = supported_simd_levels().iter().map(|l| l.name()).collect();
        Err(DtypeError::SimdUnsupported {
            origin,
            level,
            supported: names.join(", "),
        })
    }
}

/// `TRASH_PANDA_SIMD`, read once per process: the kernels ask for the level per call, far too
/// often to read the environment each time, and one level per run keeps a profile readable.
fn configured() -> &'static Result<SimdLevel, DtypeError> {
    static CONFIGURED: OnceLock<Result<SimdLevel, DtypeError>> = OnceLock::new();
    CONFIGURED.get_or_init(|| level_from_setting(std::env::var("TRASH_PANDA_SIMD").ok().as_deref()))
}

thread_local! {
    /// The level [`with_simd_level`] forces on this thread; the parallel splitter hands it to its
    /// workers so a forced job runs on that level throughout.
    static FORCED: Cell<Option<SimdLevel>> = const { Cell::new(None) };
}

/// The level forced on this thread, if any.
pub(crate) fn forced() -> Option<SimdLevel> {
    FORCED.with(Cell::get)
}

/// Runs `f` with `level` forced on this thread (`None`: not forced), restoring the previous
/// state even if `f` panics. The level must have been checked against the CPU.
pub(crate) fn with_forced<R>(level: Option<SimdLevel>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<SimdLevel>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FORCED.with(|c| c.replace(level)));
    f()
}

/// Runs `f` with every conversion on this thread (and on the threads its kernels start) on
/// `level`, for tests and benchmarks that compare the compiled paths. Fails, without running
/// `f`, when this CPU lacks the level.
pub fn with_simd_level<R>(level: SimdLevel, f: impl FnOnce() -> R) -> Result<R, DtypeError> {
    let level = checked(level, "with_simd_level")?;
    Ok(with_forced(Some(level), f))
}

/// The level conversions on this thread run: the one [`with_simd_level`] forces, else
/// `TRASH_PANDA_SIMD` (`auto`, the default, being the fastest this CPU runs). Fails when the
/// variable names an unknown level or one this CPU lacks; every conversion then fails the same
/// way, rather than quietly measuring or testing another path.
pub fn simd_level() -> Result<SimdLevel, DtypeError> {
    match forced() {
        Some(l) => Ok(l),
        None => configured().clone(),
    }
}

/// The level the compiled kernels dispatch on. The public entry points have returned
/// [`simd_level`]'s error already, so a bad setting only reaches here through internal callers,
/// which get the fastest level rather than a panic.
#[inline]
pub(crate) fn level() -> SimdLevel {
    match simd_level() {
        Ok(l) => l,
        Err(_) => best_simd_level(),
    }
}

/// Defines `pub(crate) fn $name` that runs `$body` compiled for the best instruction set found.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            match $crate::dtype::level::level() {
                #[cfg(target_arch = "x86_64")]
                $crate::dtype::level::SimdLevel::Avx512 => {
                    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                    unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                    // SAFETY: `level()` returns Avx512 only when `SimdLevel::is_supported`
                    // detected every feature enabled here on this CPU.
                    unsafe { avx512($($arg),*) }
                }
                #[cfg(target_arch = "x86_64")]
                $crate::dtype::level::SimdLevel::Avx2 => {
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                    // SAFETY: `level()` returns Avx2 only when `SimdLevel::is_supported` detected
                    // avx2 and fma on this CPU (forced and configured levels are checked too).
                    unsafe { avx2($($arg),*) }
                }
                // Off x86-64 the AVX levels are never supported, so never returned. Neon runs the
                // portable build: NEON is part of the aarch64 targets' baseline already, and its
                // hand-written kernels are called from the loops themselves.
                _ => body($($arg),*),
            }
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forcing_a_level_holds_on_this_thread_only_and_is_checked() {
        let best = best_simd_level();
        assert_eq!(supported_simd_levels().last(), Some(&best));
        for l in supported_simd_levels() {
            assert_eq!(with_simd_level(l, level).unwrap(), l);
            // Nested forcing restores the outer level.
            let outer = with_simd_level(l, || {
                with_simd_level(SimdLevel::Portable, || ()).unwrap();
                level()
            });
            assert_eq!(outer.unwrap(), l);
        }
        assert_eq!(forced(), None);
        for l in SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()) {
            let e = with_simd_level(l, || ()).unwrap_err().to_string();
            assert!(e.contains(l.name()) && e.contains("portable"), "{e}");
        }
    }

    #[test]
    fn the_setting_names_what_it_accepts_and_what_the_cpu_runs() {
        assert_eq!(level_from_setting(None).unwrap(), best_simd_level());
        assert_eq!(level_from_setting(Some("auto")).unwrap(), best_simd_level());
        assert_eq!(
            level_from_setting(Some(" Portable ")).unwrap(),
            SimdLevel::Portable
        );
        for l in supported_simd_levels() {
            assert_eq!(level_from_setting(Some(l.name())).unwrap(), l);
        }
        let e = level_from_setting(Some("sse9")).unwrap_err().to_string();
        assert!(
            e.contains("TRASH_PANDA_SIMD")
                && e.contains("sse9")
                && e.contains("auto, portable, avx2, avx512, neon"),
            "{e}"
        );
        for l in SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()) {
            let e = level_from_setting(Some(l.name())).unwrap_err().to_string();
            assert!(
                e.contains("TRASH_PANDA_SIMD") && e.contains(l.name()),
                "{e}"
            );
        }
    }
}
