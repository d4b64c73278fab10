//! The probes of whichever platform runs the tests (Linux natively, Windows under Wine in
//! `make test`): each asks its own system and gives sane figures.

use std::path::Path;

use trash_panda::sys::{current_rss, nvml, DoctorReport, GpuProbe, MemoryFigures};

#[test]
fn memory_figures_are_sane_and_only_windows_has_a_commit_charge() {
    let m = MemoryFigures::probe().unwrap();
    assert!(m.total_ram > 0 && m.available_ram <= m.total_ram, "{m:?}");
    assert!(m.usable_ram() <= m.available_ram);
    assert_eq!(m.commit.is_some(), cfg!(windows), "{m:?}");
    assert_eq!(m.is_windows(), cfg!(windows));
    if let Some(c) = m.commit {
        assert!(c.available <= c.limit && c.limit > 0, "{c:?}");
        assert!(m.usable_ram() <= c.available);
    }
    if !cfg!(target_os = "linux") {
        assert!(m.cgroup.is_none(), "cgroups are Linux's");
    }
}

#[test]
fn resident_size_is_plausible() {
    let rss = current_rss().unwrap();
    assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
}

#[test]
fn gpu_probe_names_the_platform_library_when_there_is_no_driver() {
    match nvml::probe() {
        GpuProbe::NoDriver { reason } => {
            assert!(reason.starts_with("no NVIDIA driver found"), "{reason}");
            let library = if cfg!(windows) {
                "nvml.dll"
            } else if cfg!(target_os = "macos") {
                "no NVML"
            } else {
                "libnvidia-ml.so.1"
            };
            assert!(reason.contains(library), "{reason}");
        }
        GpuProbe::Failed { reason } => assert!(!reason.is_empty()),
        GpuProbe::Found { devices, driver } => {
            assert!(!driver.is_empty() && devices.iter().all(|d| d.free <= d.total))
        }
    }
}

#[test]
fn doctor_reports_this_system() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let r = DoctorReport::collect(here, false);
    let text = r.to_string();
    assert!(r.os.is_ok() && r.cpu.is_ok() && r.memory.is_ok(), "{text}");
    assert!(matches!(r.mount, Some(Ok(_))), "{text}");
    assert!(r.cpu.as_ref().unwrap().logical_cores >= 1, "{text}");
    if cfg!(windows) {
        assert!(r.kernel.starts_with("Windows NT build"), "{text}");
        assert!(
            text.contains("commit:") && !text.contains("cgroup:"),
            "{text}"
        );
    } else {
        assert!(!text.contains("commit:"), "{text}");
    }
}
