//! Every read path, mode and thread count against `std::fs::read`, byte for byte, on files with
//! odd sizes and unaligned ranges, on the real disk (O_DIRECT) and on tmpfs-like dirs (fallback or
//! direct, whichever the kernel gives).

use std::io::Write;
use std::path::{Path, PathBuf};

use trash_panda::io::{
    cached_bytes, drop_cache, read_ranges, read_ranges_with, AlignedBuf, FileReader, IoError,
    MappedFile, ReadMode, ReadOptions, ReadRequest, POPULATE_MIN,
};

const SIZES: &[usize] = &[
    1,
    4095,
    4096,
    4097,
    3 * 4096 + 123,
    300_001,
    (1 << 20) + 4097,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn dirs() -> Vec<PathBuf> {
    // CARGO_TARGET_TMPDIR is under target/, on the real disk: O_DIRECT works there.
    let mut d = vec![
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        std::env::temp_dir(),
    ];
    if Path::new("/dev/shm").is_dir() {
        d.push(PathBuf::from("/dev/shm"));
    }
    d
}

fn write_file(dir: &Path, size: usize, seed: u64) -> (tempfile::NamedTempFile, Vec<u8>) {
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    let back = std::fs::read(f.path()).unwrap();
    assert_eq!(back, data);
    (f, back)
}

/// Random ranges of the file, with a few fixed awkward ones.
fn ranges(size: usize, rng: &mut Rng) -> Vec<(usize, usize)> {
    let mut r = vec![
        (0, size),
        (size - 1, 1),
        (size / 3, size - size / 3),
        (size, 0),
    ];
    for _ in 0..12 {
        let off = rng.below(size);
        let len = rng.below(size - off + 1);
        r.push((off, len));
    }
    r
}

#[test]
fn single_reads_match_fs_read() {
    let mut rng = Rng(7);
    for dir in dirs() {
        for &size in SIZES {
            let (f, want) = write_file(&dir, size, size as u64);
            for mode in [ReadMode::Buffered, ReadMode::Direct] {
                let r = FileReader::open(f.path(), mode).unwrap();
                let mut buf = AlignedBuf::new(size + 2 * 4096).unwrap();
                let mut bounce = AlignedBuf::new(3 * 4096).unwrap();
                for (off, len) in ranges(size, &mut rng) {
                    let want = &want[off..off + len];
                    let got = r.read_direct(off as u64, len, &mut buf).unwrap();
                    assert_eq!(got, want, "{mode} read_direct {off}+{len} of {size}");
                    // An unaligned destination: starts one byte into a Vec.
                    let mut v = vec![0u8; len + 1];
                    r.read_into(off as u64, &mut v[1..], &mut bounce).unwrap();
                    assert_eq!(&v[1..], want, "{mode} read_into {off}+{len} of {size}");
                    let mut v = vec![0u8; len];
                    r.read_exact_at(off as u64, &mut v).unwrap();
                    assert_eq!(v, want);
                }
                if mode == ReadMode::Buffered {
                    assert_eq!(r.effective_mode(), ReadMode::Buffered);
                }
            }
            let m = MappedFile::open(f.path()).unwrap();
            assert_eq!(m.bytes(), &want[..]);
        }
    }
}

#[test]
fn direct_really_is_direct_on_the_disk() {
    let (f, want) = write_file(Path::new(env!("CARGO_TARGET_TMPDIR")), 3 * 4096 + 5, 1);
    let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
    let mut buf = AlignedBuf::new(4 * 4096).unwrap();
    assert_eq!(
        r.read_direct(5, 10_000, &mut buf).unwrap(),
        &want[5..10_005]
    );
    assert_eq!(
        r.effective_mode(),
        ReadMode::Direct,
        "ext4 under target/ should take O_DIRECT"
    );
}

#[test]
fn reads_into_fresh_memory_whose_pages_are_made_present_ahead_match_the_file() {
    // Over POPULATE_MIN, so the thread that makes the destinations' pages present runs beside
    // the readers; destinations fresh (never touched), one at an odd address.
    let size = POPULATE_MIN + 3 * 4096 + 17;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (f, want) = write_file(&dir, size, 5);
    for mode in [ReadMode::Buffered, ReadMode::Direct] {
        let r = FileReader::open(f.path(), mode).unwrap();
        for threads in [1, 2, 4] {
            let half = size / 2 + 5;
            let mut a = vec![0u8; half + 1];
            let mut b = vec![0u8; size - half];
            let mut reqs = vec![
                ReadRequest::new(0, &mut a[1..]),
                ReadRequest::new(half as u64, &mut b[..]),
            ];
            let opts = ReadOptions {
                threads,
                chunk_size: 1 << 20,
                populate: true,
            };
            let stats = read_ranges_with(&r, &mut reqs, &opts).unwrap();
            assert_eq!(stats.bytes, size as u64);
            drop(reqs);
            assert!(
                a[1..] == want[..half],
                "{mode} threads {threads}: first half"
            );
            assert!(
                b[..] == want[half..],
                "{mode} threads {threads}: second half"
            );
        }
    }
}

#[test]
fn parallel_reads_match_fs_read_for_every_mode_and_thread_count() {
    let mut rng = Rng(11);
    for dir in dirs() {
        for &size in &[4097usize, 300_001, (1 << 20) + 4097] {
            let (f, want) = write_file(&dir, size, 99 + size as u64);
            for mode in [ReadMode::Buffered, ReadMode::Direct] {
                let r = FileReader::open(f.path(), mode).unwrap();
                for threads in [1, 2, 3, 5] {
                    for chunk_size in [4096, 65536, 8 << 20] {
                        let rs = ranges(size, &mut rng);
                        // Alternate plain Vecs (at an odd address) and aligned buffers.
                        let mut vecs: Vec<Vec<u8>> =
                            rs.iter().map(|&(_, len)| vec![0u8; len + 1]).collect();
                        let mut alig: Vec<AlignedBuf> = rs
                            .iter()
                            .map(|&(_, len)| AlignedBuf::new(len).unwrap())
                            .collect();
                        let mut reqs = Vec::new();
                        for (i, ((&(off, len), v), a)) in
                            rs.iter().zip(&mut vecs).zip(&mut alig).enumerate()
                        {
                            let dst = if i % 2 == 0 {
                                &mut v[1..]
                            } else {
                                &mut a[..len]
                            };
                            reqs.push(ReadRequest::new(off as u64, dst));
                        }
                        let opts = ReadOptions {
                            threads,
                            chunk_size,
                            populate: false,
                        };
                        let stats = read_ranges_with(&r, &mut reqs, &opts).unwrap();
                        let total: usize = rs.iter().map(|r| r.1).sum();
                        assert_eq!(stats.bytes, total as u64);
                        assert_eq!(stats.mode, r.effective_mode());
                        drop(reqs);
                        for (i, &(off, len)) in rs.iter().enumerate() {
                            let got = if i % 2 == 0 {
                                &vecs[i][1..]
                            } else {
                                &alig[i][..len]
                            };
                            assert_eq!(
                                got,
                                &want[off..off + len],
                                "{mode} threads {threads} chunk {chunk_size} range {off}+{len} of {size} in {}",
                                dir.display()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn bad_ranges_are_errors_not_panics() {
    let (f, _) = write_file(Path::new(env!("CARGO_TARGET_TMPDIR")), 5000, 3);
    let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
    let mut a = vec![0u8; 10];
    let mut b = vec![0u8; 10];
    let mut reqs = [ReadRequest::new(0, &mut a), ReadRequest::new(4995, &mut b)];
    let err = read_ranges(&r, &mut reqs, 2).unwrap_err();
    match &err {
        IoError::OutOfRange {
            offset,
            len,
            file_size,
            ..
        } => assert_eq!((*offset, *len, *file_size), (4995, 10, 5000)),
        other => panic!("unexpected {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("4995..5005") && msg.contains(&f.path().display().to_string()));
    let mut reqs: [ReadRequest; 0] = [];
    assert_eq!(read_ranges(&r, &mut reqs, 4).unwrap().bytes, 0);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "only Linux can evict one file's pages (posix_fadvise) and count them (mincore)"
)]
fn drop_cache_makes_a_cold_file() {
    let (f, _) = write_file(Path::new(env!("CARGO_TARGET_TMPDIR")), 4 << 20, 5);
    drop_cache(f.path()).unwrap();
    let cold = cached_bytes(f.path()).unwrap();
    assert!(cold < 1 << 20, "{cold} bytes still cached after drop_cache");
    let r = FileReader::open(f.path(), ReadMode::Buffered).unwrap();
    let mut v = vec![0u8; 4 << 20];
    r.read_exact_at(0, &mut v).unwrap();
    assert_eq!(cached_bytes(f.path()).unwrap(), 4 << 20);
}
