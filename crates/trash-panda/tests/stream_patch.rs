//! Patched blocks against real files: a patch is staged from the next staging on, on every tier
//! and in both places (private memory, an overlay file), never from a staging made before it;
//! taking it back stages the checkpoint's exact bytes again; bad patches leave the block as it
//! was.

mod common;

use common::{Dir, Rng};
use std::collections::BTreeMap;
use std::path::PathBuf;

use trash_panda::io::ReadMode;
use trash_panda::rules::patched_image_bytes;
use trash_panda::stream::{
    Engine, EngineOptions, OverlayStore, Patch, PatchPlace, RamSource, SourceTier, StreamBlock,
    StreamError, StreamTensor,
};
use trash_panda::DType;

const BLOCKS: usize = 4;
const TENSORS: usize = 3;

/// One file of random bytes; each block three u8 tensors of odd lengths.
fn checkpoint(dir: &Dir, tier: SourceTier) -> (Vec<PathBuf>, Vec<StreamBlock>, Vec<u8>) {
    checkpoint_of(dir, tier, DType::U8)
}

/// As [`checkpoint`], the tensors of `dtype` (bf16 ones may be used in place at any offset).
fn checkpoint_of(
    dir: &Dir,
    tier: SourceTier,
    dtype: DType,
) -> (Vec<PathBuf>, Vec<StreamBlock>, Vec<u8>) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let data: Vec<u8> = (0..200_000).map(|_| rng.next() as u8).collect();
    let path = dir.0.join("model.safetensors");
    std::fs::write(&path, &data).unwrap();
    let mut blocks = Vec::new();
    let mut at = 16u64;
    for b in 0..BLOCKS {
        let mut tensors = Vec::new();
        for t in 0..TENSORS {
            let size = dtype.size() as u64;
            let len = (3_000 + rng.below(9_000)) / size * size;
            tensors.push(StreamTensor {
                name: format!("blocks.{b}.w{t}"),
                file: 0,
                start: at,
                end: at + len,
                dtype,
                shape: vec![(len / size) as usize],
                rows: None,
            });
            at += len + rng.below(200);
        }
        blocks.push(StreamBlock {
            name: format!("blocks.{b}"),
            tier,
            tensors,
        });
    }
    (vec![path], blocks, data)
}

fn engine(files: &[PathBuf], blocks: &[StreamBlock], ram: RamSource) -> Engine {
    engine_with(files, blocks, ram, false)
}

fn engine_with(
    files: &[PathBuf],
    blocks: &[StreamBlock],
    ram: RamSource,
    in_place: bool,
) -> Engine {
    let options = EngineOptions {
        ram_source: ram,
        disk_mode: ReadMode::Direct,
        lookahead: 2,
        in_place,
        ram_in_place: in_place,
        ..EngineOptions::default()
    };
    Engine::new(blocks.to_vec(), files.to_vec(), options).unwrap()
}

/// Every tensor of block `b` as staged now, against `want(tensor) -> bytes`.
fn check(e: &Engine, b: usize, want: impl Fn(usize) -> Vec<u8>) {
    let lease = e.acquire(b).unwrap();
    for t in 0..TENSORS {
        assert!(lease.tensor(t).unwrap() == want(t), "block {b} tensor {t}");
    }
}

fn original(blocks: &[StreamBlock], data: &[u8], b: usize, t: usize) -> Vec<u8> {
    let s = &blocks[b].tensors[t];
    data[s.start as usize..s.end as usize].to_vec()
}

fn new_bytes(blocks: &[StreamBlock], b: usize, t: usize, fill: u8) -> Vec<u8> {
    let s = &blocks[b].tensors[t];
    vec![fill; (s.end - s.start) as usize]
}

/// A pass over every block, so the engine stages ahead.
fn pass(e: &Engine) {
    for b in 0..BLOCKS {
        drop(e.acquire(b).unwrap());
    }
}

#[test]
fn a_patch_is_staged_from_the_next_staging_on_and_taken_back_exactly() {
    let cases = [
        (
            "ram-mapped",
            SourceTier::Ram,
            RamSource::Mapped,
            PatchPlace::Memory,
        ),
        (
            "ram-in-memory",
            SourceTier::Ram,
            RamSource::InMemory { threads: 2 },
            PatchPlace::Memory,
        ),
        (
            "disk-memory",
            SourceTier::Disk,
            RamSource::Mapped,
            PatchPlace::Memory,
        ),
        (
            "disk-file",
            SourceTier::Disk,
            RamSource::Mapped,
            PatchPlace::File,
        ),
    ];
    for (name, tier, ram, place) in cases {
        let dir = Dir::new(&format!("patch-{name}"));
        let (files, blocks, data) = checkpoint(&dir, tier);
        let e = engine(&files, &blocks, ram);
        e.keep_overlays_in(OverlayStore::open(dir.0.join("overlays"), 1 << 30).unwrap());
        pass(&e);
        // Block 1 is staged ahead now; it must not be served as it was before the patch.
        pass(&e);
        let w1 = new_bytes(&blocks, 1, 1, 0xa5);
        let patch = [Patch {
            tensor: 1,
            data: &w1,
            scale: None,
        }];
        // Patched while block 1 is leased: the lease keeps its bytes, the next staging has new.
        let lease = e.acquire(1).unwrap();
        assert_eq!(
            e.patch(1, &patch, "lora a 1.0", place).unwrap(),
            place,
            "{name}"
        );
        assert!(lease.tensor(1).unwrap() == original(&blocks, &data, 1, 1));
        drop(lease);
        for _ in 0..2 {
            pass(&e);
            check(&e, 1, |t| {
                if t == 1 {
                    w1.clone()
                } else {
                    original(&blocks, &data, 1, t)
                }
            });
            check(&e, 2, |t| original(&blocks, &data, 2, t));
        }
        assert_eq!(e.patches(1).unwrap(), vec![(1, "lora a 1.0".to_owned())]);
        let held = e.overlay_bytes();
        assert_eq!(held.blocks, 1, "{name}");
        let len = e.patched_image_len(1).unwrap() as u64;
        match place {
            PatchPlace::Memory => {
                assert_eq!(held.file, 0, "{name}");
                assert_eq!(held.memory, patched_image_bytes(len, true), "{name}");
                assert!(held.memory >= len && held.memory < len + 4096, "{name}");
            }
            PatchPlace::File => {
                assert_eq!((held.memory, held.file), (0, len), "{name}");
                let files = std::fs::read_dir(dir.0.join("overlays")).unwrap().flatten();
                let sizes: Vec<u64> = files.map(|f| f.metadata().unwrap().len()).collect();
                assert_eq!(sizes, vec![len], "{name}");
            }
        }
        // A second tensor under another key, then the first taken back: the second stays.
        let w2 = new_bytes(&blocks, 1, 2, 0x5a);
        let second = [Patch {
            tensor: 2,
            data: &w2,
            scale: None,
        }];
        e.patch(1, &second, "lora b 0.5", PatchPlace::Memory)
            .unwrap();
        let overlays = || {
            std::fs::read_dir(dir.0.join("overlays"))
                .unwrap()
                .flatten()
                .map(|f| f.path())
                .collect::<Vec<_>>()
        };
        let named = overlays();
        e.unpatch(1, &[1]).unwrap();
        if place == PatchPlace::File {
            // An overlay file is the image of one set of merges: it stays as it is, for a later
            // adoption, and the block goes back to the checkpoint's bytes whole.
            assert_eq!(named.len(), 1);
            assert_eq!(overlays(), named, "{name}");
            assert!(e.patches(1).unwrap().is_empty() && e.overlay_bytes().blocks == 0);
            pass(&e);
            check(&e, 1, |t| original(&blocks, &data, 1, t));
            // Adopted again by its merges' keys: staged merged, nothing merged.
            let both: BTreeMap<usize, String> =
                [(1, "lora a 1.0".to_owned()), (2, "lora b 0.5".to_owned())].into();
            let other: BTreeMap<usize, String> = [(1, "lora a 0.9".to_owned())].into();
            assert!(!e.adopt(1, &other).unwrap());
            assert!(e.adopt(1, &both).unwrap(), "{name}");
            pass(&e);
            check(&e, 1, |t| match t {
                1 => w1.clone(),
                2 => w2.clone(),
                _ => original(&blocks, &data, 1, t),
            });
            e.unpatch(1, &[2]).unwrap();
            assert_eq!(overlays(), named, "{name}");
            continue;
        }
        pass(&e);
        check(&e, 1, |t| {
            if t == 2 {
                w2.clone()
            } else {
                original(&blocks, &data, 1, t)
            }
        });
        // The last one taken back: the checkpoint's bytes, and nothing held.
        e.unpatch(1, &[2, 0]).unwrap();
        pass(&e);
        check(&e, 1, |t| original(&blocks, &data, 1, t));
        assert_eq!(e.overlay_bytes().blocks, 0, "{name}");
        assert!(e.patches(1).unwrap().is_empty());
        assert!(overlays().is_empty(), "{name}: {:?}", overlays());
    }
}

#[test]
fn an_overlay_file_outlives_its_engine_and_a_later_one_adopts_it() {
    let dir = Dir::new("patch-adopt");
    let (files, blocks, data) = checkpoint(&dir, SourceTier::Disk);
    let store = || OverlayStore::open(dir.0.join("overlays"), 1 << 30).unwrap();
    let w = new_bytes(&blocks, 2, 0, 9);
    let keys: BTreeMap<usize, String> = [(0, "lora a 1.0".to_owned())].into();
    {
        let e = engine(&files, &blocks, RamSource::Mapped);
        e.keep_overlays_in(store());
        let patch = [Patch {
            tensor: 0,
            data: &w,
            scale: None,
        }];
        e.patch(2, &patch, "lora a 1.0", PatchPlace::File).unwrap();
    }
    assert_eq!(
        std::fs::read_dir(dir.0.join("overlays")).unwrap().count(),
        1
    );
    let e = engine(&files, &blocks, RamSource::Mapped);
    // No folder: nothing to adopt.
    assert!(!e.adopt(2, &keys).unwrap());
    e.keep_overlays_in(store());
    // Another block, or other merges, name other files.
    assert!(!e.adopt(1, &keys).unwrap());
    assert!(e.adopt(2, &keys).unwrap());
    assert_eq!(e.patches(2).unwrap(), vec![(0, "lora a 1.0".to_owned())]);
    check(&e, 2, |t| {
        if t == 0 {
            w.clone()
        } else {
            original(&blocks, &data, 2, t)
        }
    });
    // A checkpoint rewritten since names other files too.
    drop(e);
    std::fs::write(&files[0], &data).unwrap();
    let e = engine(&files, &blocks, RamSource::Mapped);
    e.keep_overlays_in(store());
    assert!(!e.adopt(2, &keys).unwrap());
}

#[test]
fn bad_patches_are_refused_and_leave_the_block_as_it_was() {
    let dir = Dir::new("patch-bad");
    let (files, blocks, data) = checkpoint(&dir, SourceTier::Disk);
    let e = engine(&files, &blocks, RamSource::Mapped);
    let short = vec![0u8; 10];
    let refused = |tensor: usize, bytes: &[u8], scale: Option<&[u8]>, place: PatchPlace| {
        let patch = [Patch {
            tensor,
            data: bytes,
            scale,
        }];
        let err = e.patch(0, &patch, "k", place).unwrap_err();
        assert!(matches!(err, StreamError::Patch { .. }), "{err}");
        err.to_string()
    };
    let msg = refused(0, &short, None, PatchPlace::Memory);
    assert!(
        msg.contains("blocks.0.w0") && msg.contains("10 bytes given"),
        "{msg}"
    );
    let msg = refused(7, &short, None, PatchPlace::Memory);
    assert!(msg.contains("stages 3 tensors"), "{msg}");
    let right = new_bytes(&blocks, 0, 0, 1);
    let msg = refused(0, &right, Some(&short), PatchPlace::Memory);
    assert!(msg.contains("without any"), "{msg}");
    // A file with no folder set.
    let msg = refused(0, &right, None, PatchPlace::File);
    assert!(msg.contains("no overlay folder"), "{msg}");
    assert_eq!(e.overlay_bytes().blocks, 0);
    check(&e, 0, |t| original(&blocks, &data, 0, t));
    assert!(matches!(
        e.patch(9, &[], "k", PatchPlace::Memory),
        Err(StreamError::UnknownBlock { .. })
    ));
}

#[test]
fn a_full_overlay_folder_refuses_the_file_and_the_block_stays_unpatched() {
    let dir = Dir::new("patch-full");
    let (files, blocks, data) = checkpoint(&dir, SourceTier::Disk);
    let e = engine(&files, &blocks, RamSource::Mapped);
    let len = e.staged_layout().block_len(0) as u64;
    e.keep_overlays_in(OverlayStore::open(dir.0.join("overlays"), len).unwrap());
    let w = new_bytes(&blocks, 0, 0, 3);
    let patch = [Patch {
        tensor: 0,
        data: &w,
        scale: None,
    }];
    e.patch(0, &patch, "k", PatchPlace::File).unwrap();
    let w = new_bytes(&blocks, 1, 0, 4);
    let patch = [Patch {
        tensor: 0,
        data: &w,
        scale: None,
    }];
    let err = e.patch(1, &patch, "k", PatchPlace::File).unwrap_err();
    assert!(matches!(err, StreamError::OverlayFull { .. }), "{err}");
    assert!(e.patches(1).unwrap().is_empty());
    check(&e, 1, |t| original(&blocks, &data, 1, t));
    // In memory it is kept all the same.
    assert_eq!(
        e.patch(1, &patch, "k", PatchPlace::Memory).unwrap(),
        PatchPlace::Memory
    );
    check(&e, 1, |t| {
        if t == 0 {
            w.clone()
        } else {
            original(&blocks, &data, 1, t)
        }
    });
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn a_block_used_in_place_keeps_its_image_in_a_file_mapped_as_the_checkpoint_is() {
    let dir = Dir::new("patch-in-place");
    let (files, blocks, data) = checkpoint_of(&dir, SourceTier::Disk, DType::BF16);
    let e = engine_with(&files, &blocks, RamSource::Mapped, true);
    let w = new_bytes(&blocks, 0, 0, 7);
    let patch = [Patch {
        tensor: 0,
        data: &w,
        scale: None,
    }];
    // No folder: refused, and in memory too (its leases are views of a map).
    let err = e.patch(0, &patch, "k", PatchPlace::Memory).unwrap_err();
    assert!(err.to_string().contains("overlay file"), "{err}");
    e.keep_overlays_in(OverlayStore::open(dir.0.join("overlays"), 1 << 30).unwrap());
    e.patch(0, &patch, "k", PatchPlace::File).unwrap();
    let lease = e.acquire(0).unwrap();
    assert!(lease.in_place());
    // Views of the image's map, aligned as kernels want them.
    for t in 0..TENSORS {
        let view = lease.tensor(t).unwrap();
        assert_eq!(view.as_ptr() as usize % 64, 0);
        let want = if t == 0 {
            w.clone()
        } else {
            original(&blocks, &data, 0, t)
        };
        assert!(view == want, "tensor {t}");
        lease.forget_tensor(t).unwrap();
    }
    // A write through a writable view stays in this process's copy and goes with the lease.
    let span = lease.tensor_writable(1).unwrap();
    // SAFETY: the span is the lease's own private page copy, valid while the lease lives.
    unsafe { *span.as_mut_ptr() ^= 0xff };
    drop(lease);
    check(&e, 0, |t| {
        if t == 0 {
            w.clone()
        } else {
            original(&blocks, &data, 0, t)
        }
    });
}

#[test]
#[cfg_attr(windows, ignore = "a file held open cannot be removed on Windows")]
fn a_write_that_fails_part_way_drops_the_image_and_every_patch() {
    let dir = Dir::new("patch-lost");
    let (files, blocks, data) = checkpoint(&dir, SourceTier::Disk);
    let e = engine(&files, &blocks, RamSource::Mapped);
    e.keep_overlays_in(OverlayStore::open(dir.0.join("overlays"), 1 << 30).unwrap());
    let w0 = new_bytes(&blocks, 0, 0, 1);
    let w1 = new_bytes(&blocks, 0, 1, 2);
    let first = [Patch {
        tensor: 0,
        data: &w0,
        scale: None,
    }];
    let second = [Patch {
        tensor: 1,
        data: &w1,
        scale: None,
    }];
    e.patch(0, &first, "k", PatchPlace::File).unwrap();
    // The file goes from under the engine (a cleaner, another process): the next write fails.
    for f in std::fs::read_dir(dir.0.join("overlays")).unwrap().flatten() {
        std::fs::remove_file(f.path()).unwrap();
    }
    let err = e.patch(0, &second, "k", PatchPlace::File).unwrap_err();
    assert!(matches!(err, StreamError::Overlay { .. }), "{err}");
    assert!(e.patches(0).unwrap().is_empty() && e.overlay_bytes().blocks == 0);
    check(&e, 0, |t| original(&blocks, &data, 0, t));
}
