//! The unbuffered reader of each platform (O_DIRECT, FILE_FLAG_NO_BUFFERING, F_NOCACHE) on
//! files whose sizes are not multiples of the sector size: every read equals a buffered read
//! of the same range. `make test` runs this file natively and, built for Windows, under Wine.

use std::io::Write;
use std::path::Path;

use trash_panda::io::{read_exact_at, AlignedBuf, FileReader, IoError, ReadMode};

/// Sector sizes are 512 or 4096 bytes; these sizes end just before, on and just after both.
const SIZES: &[usize] = &[
    1,
    511,
    512,
    513,
    4095,
    4097,
    8191,
    3 * 4096 + 123,
    65_537,
    (1 << 20) + 511,
];

fn pattern(size: usize, seed: u64) -> Vec<u8> {
    (0..size as u64)
        .map(|i| ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect()
}

// Under target/, on the real disk: tmpfs would refuse O_DIRECT and hide the unbuffered path.
fn disk_file(bytes: &[u8]) -> tempfile::NamedTempFile {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

/// Ranges that start and end on, before and after sector and page boundaries, and the tail.
fn ranges(size: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, size), (size - 1, 1), (0, 1)];
    for start in [1, 511, 512, 513, 4095, 4096, 4097] {
        if start < size {
            for len in [1, 511, 512, 4096, 5000, size - start] {
                out.push((start, len.min(size - start)));
            }
        }
    }
    out
}

#[test]
fn unbuffered_reads_equal_buffered_reads_on_odd_sizes() {
    let mut buf = AlignedBuf::new((1 << 20) + 3 * 4096).unwrap();
    let mut bounce = AlignedBuf::new(4 * 4096).unwrap();
    for (i, &size) in SIZES.iter().enumerate() {
        let data = pattern(size, i as u64);
        let f = disk_file(&data);
        let direct = FileReader::open(f.path(), ReadMode::Direct).unwrap();
        let buffered = FileReader::open(f.path(), ReadMode::Buffered).unwrap();
        for (off, len) in ranges(size) {
            let mut want = vec![0u8; len];
            buffered.read_exact_at(off as u64, &mut want).unwrap();
            assert_eq!(
                want,
                &data[off..off + len],
                "buffered {off}+{len} of {size}"
            );
            let got = direct.read_direct(off as u64, len, &mut buf).unwrap();
            assert_eq!(got, &want[..], "read_direct {off}+{len} of {size}");
            let mut v = vec![0u8; len];
            direct.read_into(off as u64, &mut v, &mut bounce).unwrap();
            assert_eq!(v, want, "read_into {off}+{len} of {size}");
        }
        // The disk under target/ takes unbuffered reads on every platform we test on, so a
        // fallback here would mean the platform code refused its own aligned requests.
        assert_eq!(
            direct.effective_mode(),
            ReadMode::Direct,
            "{} fell back to buffered reads on a {size}-byte file",
            FileReader::unbuffered_flag()
        );
    }
}

#[test]
fn each_platform_names_its_unbuffered_flag() {
    let expected = if cfg!(windows) {
        "FILE_FLAG_NO_BUFFERING"
    } else if cfg!(target_os = "macos") {
        "F_NOCACHE"
    } else {
        "O_DIRECT"
    };
    assert_eq!(FileReader::unbuffered_flag(), expected);
}

#[test]
fn reads_past_the_end_fail_and_name_the_file() {
    let data = pattern(4097, 7);
    let f = disk_file(&data);
    let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
    let mut buf = AlignedBuf::new(3 * 4096).unwrap();
    let e = r.read_direct(4000, 200, &mut buf).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::OutOfRange {
                file_size: 4097,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains(&f.path().display().to_string()),
        "{e}"
    );
    // The positional read under the checkpoint header reader: a short file is UnexpectedEof.
    let file = std::fs::File::open(f.path()).unwrap();
    let mut head = [0u8; 16];
    read_exact_at(&file, &mut head, 4090).unwrap_err();
    read_exact_at(&file, &mut head, 4081).unwrap();
    assert_eq!(head, data[4081..]);
    let mut none = [0u8; 4];
    let e = read_exact_at(&file, &mut none, 1 << 40).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
}

#[test]
fn read_advice_is_accepted_or_a_no_op() {
    let data = pattern(70_000, 3);
    let f = disk_file(&data);
    let r = FileReader::open(f.path(), ReadMode::Buffered).unwrap();
    r.advise_read(0, 70_000).unwrap();
    r.advise_read(65_536, 100).unwrap();
    assert!(matches!(
        r.advise_read(69_999, 2),
        Err(IoError::OutOfRange { .. })
    ));
}

#[test]
fn threads_share_one_unbuffered_reader() {
    let size = (1 << 20) + 777;
    let data = pattern(size, 11);
    let f = disk_file(&data);
    let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (r, data) = (&r, &data);
            s.spawn(move || {
                let mut bounce = AlignedBuf::new(2 * 4096).unwrap();
                for k in 0..50usize {
                    let off = (t * 97_003 + k * 19_997) % (size - 10_000);
                    let mut v = vec![0u8; 9_999];
                    r.read_into(off as u64, &mut v, &mut bounce).unwrap();
                    assert_eq!(v, &data[off..off + 9_999], "thread {t} read {k}");
                }
            });
        }
    });
}
