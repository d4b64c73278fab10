//! fp8 -> 16-bit kernels with a scale.

use core::arch::x86_64::*;

use super::primitives::prefetch;
use super::table::{bytes_of, bytes_with, load_codes, step, store_64, tiles_at, Fixed, Fp8, Table};
use super::Stores;
use crate::dtype::fp8::{e4m3_to_f32_bits, e5m2_to_f32_bits};
use crate::dtype::half::f32_bits_to_bf16_bf;

/// Below this many codes building a table (sixteen scalar products) costs more than it saves;
/// at least 32, a whole lookup step.
const TABLE_MIN: usize = 256;

/// Whether [`fp8_to_bf16_scaled`] looks `n` codes times `k` up in a table (else it computes).
pub(crate) fn uses_table(n: usize, k: f32) -> bool {
    n >= TABLE_MIN && Table::holds(k)
}

/// fp8 codes (of `fmt`) times `k`, rounded to bf16: equal to decoding each code to f32
/// exactly, multiplying by `k` in f32 and rounding to nearest even (NaN -> `0x7FC0 | sign`).
/// `dst` holds two bytes per code of `src`. With `k` = 1 it is the plain conversion.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn fp8_to_bf16_scaled(fmt: Fp8, src: &[u8], dst: &mut [u8], k: f32, stores: Stores) {
    let n = src.len().min(dst.len() / 2);
    if uses_table(n, k) {
        let table = Table::new(k, fmt);
        let (head, stores) = stores.head(dst.as_ptr(), 2, n);
        // The head and the tail (under 32 codes each) come out of whole 32-code windows, which
        // n >= TABLE_MIN >= 32 guarantees.
        let one = (Some(&table), Some(&table), 32);
        let fallback = |s: &[u8], d: &mut [u8]| computed(fmt, s, d, k);
        window(fmt, &src[..32], 0, &mut dst[..2 * head], one, fallback);
        let done = head + lookup(&src[head..n], &mut dst[2 * head..2 * n], &table, stores);
        let (tail, rest) = (&mut dst[2 * done..2 * n], n - done);
        window(fmt, &src[n - 32..n], 32 - rest, tail, one, fallback);
    } else {
        computed(fmt, &src[..n], &mut dst[..2 * n], k);
    }
}

/// [`computed`] kept out of line for the unrolled table steps: a NaN code is rare, and its
/// code inlined four times over would sit between the steps that do run.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
fn computed_cold(fmt: Fp8, src: &[u8], dst: &mut [u8], k: f32) {
    computed(fmt, src, dst, k);
}

/// Codes of `fmt` times `k` without a table: in registers for e4m3, one at a time for e5m2
/// (which only reaches here for NaN and infinity codes, heads and tails, and scales the table
/// does not hold for).
#[target_feature(enable = "avx2,fma")]
fn computed(fmt: Fp8, src: &[u8], dst: &mut [u8], k: f32) {
    match fmt {
        Fp8::E4m3 => e4m3_to_bf16_computed(src, dst, k),
        Fp8::E5m2 => {
            for (c, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                let x = f32::from_bits(e5m2_to_f32_bits(*c)) * k;
                d.copy_from_slice(&f32_bits_to_bf16_bf(x.to_bits()).to_le_bytes());
            }
        }
    }
}

/// Looks up the codes of `src` in `table` into `dst` (two bytes per code), 32 at a time;
/// returns how many it did (the rest, under 32, is the caller's). With streaming stores `dst`
/// is 32-byte aligned.
#[target_feature(enable = "avx2,fma")]
fn lookup(src: &[u8], dst: &mut [u8], table: &Table, stores: Stores) -> usize {
    let n = src.len().min(dst.len() / 2);
    let finite = table.fmt.finite();
    let mut i = 0;
    while i + 32 <= n {
        prefetch(src, i);
        // SAFETY: i + 32 <= n <= src.len(): the 32 bytes at src[i..] are in bounds.
        let (c, mag, nan) = unsafe { load_codes(src.as_ptr().add(i), finite) };
        if nan {
            // A NaN or infinite code (rare; the identity does not cover them): computed.
            let d = &mut dst[2 * i..2 * i + 64];
            computed(table.fmt, &src[i..i + 32], d, table.k);
        } else {
            let (lo, hi) = bytes_of(c, mag, table);
            // SAFETY: 2 * (i + 32) <= 2 * n <= dst.len(): the 64 bytes at dst[2 * i..] are in
            // bounds; aligned when streaming (the caller aligned dst, and each step adds 64).
            unsafe { store_64(dst.as_mut_ptr().add(2 * i), lo, hi, stores) };
        }
        i += 32;
    }
    i
}

/// Whole rows `first_row..` (of `cols` codes) of an fp8 (`fmt`) -> bf16 expansion with `block` x `block` scales
/// (`scales` row-major over the tile grid, as `Scale::Block`). A tile's table is shared by
/// `block` rows, so each block row builds one per tile and every row of it looks them up.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn fp8_to_bf16_blocks(
    fmt: Fp8,
    src: &[u8],
    dst: &mut [u8],
    (first_row, cols): (usize, usize),
    scales: &[f32],
    block: usize,
    stores: Stores,
) {
    if cols == 0 || block == 0 {
        return;
    }
    let tiles = cols.div_ceil(block);
    let mut tables: Vec<Option<Table>> = Vec::new();
    let mut tables_of = usize::MAX;
    let rows = src.chunks_exact(cols).zip(dst.chunks_exact_mut(2 * cols));
    for (i, (s, d)) in rows.enumerate() {
        let block_row = (first_row + i) / block;
        let ks = &scales[block_row * tiles..][..tiles];
        if block_row != tables_of {
            // Scales the table does not hold for (see `Table`) are computed instead.
            tables = ks
                .iter()
                .map(|&k| Table::holds(k).then(|| Table::new(k, fmt)))
                .collect();
            tables_of = block_row;
        }
        if block < 32 {
            computed_tiles(fmt, s, d, 0, ks, block);
        } else {
            row_of_tiles(fmt, s, d, ks, &tables, block, stores);
        }
    }
}

/// Codes `at..` of the 32-code window `win` into `dst` (which holds fewer than 32 results),
/// through a stack buffer: the head before aligned stores and the tail after them, by table
/// rather than one at a time. The tables are [`step`]'s; where it gives `None`,
/// `fallback(codes, dst)` computes them.
#[target_feature(enable = "avx2,fma")]
fn window(
    fmt: Fp8,
    win: &[u8],
    at: usize,
    dst: &mut [u8],
    (a, b, before): (Option<&Table>, Option<&Table>, usize),
    fallback: impl FnOnce(&[u8], &mut [u8]),
) {
    let count = dst.len() / 2;
    if count == 0 || win.len() < 32 || at + count > 32 {
        fallback(&win[at..at + count], dst);
        return;
    }
    // SAFETY: `win` holds at least 32 bytes (checked above).
    let codes = unsafe { load_codes(win.as_ptr(), fmt.finite()) };
    match step(codes, a, b, before) {
        Some((lo, hi)) => {
            let mut buf = [0u8; 64];
            // SAFETY: `buf` is 64 writable bytes; plain stores need no alignment.
            unsafe { store_64(buf.as_mut_ptr(), lo, hi, Stores::Cached) };
            dst.copy_from_slice(&buf[2 * at..2 * (at + count)]);
        }
        None => fallback(&win[at..at + count], dst),
    }
}

/// One row of [`fp8_to_bf16_blocks`] (`block` >= 32): the row is one run of 32-code steps
/// aligned for streaming stores, not one run per tile (a tile's 256 bytes would leave cache
/// lines half streamed and half stored plainly, which stalls).
#[target_feature(enable = "avx2,fma")]
fn row_of_tiles(
    fmt: Fp8,
    s: &[u8],
    d: &mut [u8],
    ks: &[f32],
    tables: &[Option<Table>],
    block: usize,
    stores: Stores,
) {
    let n = s.len().min(d.len() / 2);
    if n < 32 {
        computed_tiles(fmt, &s[..n], &mut d[..2 * n], 0, ks, block);
        return;
    }
    let (head, stores) = stores.head(d.as_ptr(), 2, n);
    let fallback = |s: &[u8], d: &mut [u8]| computed_tiles(fmt, s, d, 0, ks, block);
    window(
        fmt,
        &s[..32],
        0,
        &mut d[..2 * head],
        tiles_at(tables, 0, block),
        fallback,
    );
    let mut i = head;
    if head == 0 && block.is_multiple_of(32) {
        // Every step lies inside one tile: the steps run tile by tile without the edge
        // bookkeeping below (which cost 40% of the speed in cache).
        i = aligned_tiles(fmt, &s[..n], &mut d[..2 * n], ks, tables, block, stores);
    }
    let finite = fmt.finite();
    let mut t = i / block;
    while i + 32 <= n {
        // The steps inside tile t run as one lookup with its table in registers; then the
        // step across its edge, if any (per-step bookkeeping halved the speed in cache).
        let edge = ((t + 1) * block).min(n);
        match tables.get(t).and_then(Option::as_ref) {
            Some(a) => i += lookup(&s[i..edge], &mut d[2 * i..2 * edge], a, stores),
            None => {
                while i + 32 <= edge {
                    computed_tiles(fmt, &s[i..i + 32], &mut d[2 * i..2 * i + 64], i, ks, block);
                    i += 32;
                }
            }
        }
        if i + 32 > n {
            break;
        }
        if i < edge {
            // SAFETY: i + 32 <= n <= s.len(): the 32 bytes at s[i..] are in bounds.
            let codes = unsafe { load_codes(s.as_ptr().add(i), finite) };
            let table = |t: usize| tables.get(t).and_then(Option::as_ref);
            match step(codes, table(t), table(t + 1), edge - i) {
                // SAFETY: 2 * (i + 32) <= 2 * n <= d.len(): the 64 bytes at d[2 * i..] are in
                // bounds; aligned when streaming (`head` aligned d + 2 * head; steps add 64).
                Some((lo, hi)) => unsafe { store_64(d.as_mut_ptr().add(2 * i), lo, hi, stores) },
                // A NaN code, or a scale without a table: computed, tile by tile.
                None => {
                    let dd = &mut d[2 * i..2 * i + 64];
                    computed_tiles(fmt, &s[i..i + 32], dd, i, ks, block);
                }
            }
            i += 32;
        }
        t += 1;
    }
    let (start, rest) = (n - 32, n - i);
    let fallback = |s: &[u8], d: &mut [u8]| computed_tiles(fmt, s, d, i, ks, block);
    let tail = &mut d[2 * i..2 * n];
    window(
        fmt,
        &s[start..n],
        32 - rest,
        tail,
        tiles_at(tables, start, block),
        fallback,
    );
}

/// The whole 32-code steps of a row of `block`-code tiles (`block` a multiple of 32) whose first
/// step starts the row, so that no step straddles a tile edge; returns where they stop (the
/// caller writes the rest, under 32 codes). A 128-code tile, the usual block, is four steps
/// written out, with its table read into registers once.
#[target_feature(enable = "avx2,fma")]
fn aligned_tiles(
    fmt: Fp8,
    s: &[u8],
    d: &mut [u8],
    ks: &[f32],
    tables: &[Option<Table>],
    block: usize,
    stores: Stores,
) -> usize {
    let n = s.len().min(d.len() / 2);
    let Some(fixed) = tables.iter().flatten().next().map(Table::fixed) else {
        // No tile has a table: all computed.
        computed_tiles(fmt, &s[..n / 32 * 32], &mut d[..n / 32 * 64], 0, ks, block);
        return n / 32 * 32;
    };
    let mut i = 0;
    for (t, table) in tables.iter().enumerate() {
        let end = ((t + 1) * block).min(n);
        let steps = end.saturating_sub(i) / 32;
        if steps == 0 {
            break;
        }
        let (src, dst) = (&s[i..i + 32 * steps], &mut d[2 * i..2 * (i + 32 * steps)]);
        match table {
            Some(table) if steps == 4 => tile_steps::<4>(src, dst, table, &fixed, stores),
            Some(table) => {
                let pairs = src.chunks_exact(32).zip(dst.chunks_exact_mut(64));
                for (src, dst) in pairs {
                    tile_steps::<1>(src, dst, table, &fixed, stores);
                }
            }
            None => computed(fmt, src, dst, ks[t]),
        }
        i += 32 * steps;
    }
    i
}

/// `STEPS` 32-code steps of one table: `src` holds `32 * STEPS` codes, `dst` twice as many
/// bytes (32-byte aligned when streaming). A NaN or infinite code sends its step to `computed`.
#[target_feature(enable = "avx2,fma")]
fn tile_steps<const STEPS: usize>(
    src: &[u8],
    dst: &mut [u8],
    table: &Table,
    fixed: &Fixed,
    stores: Stores,
) {
    assert!(src.len() >= 32 * STEPS && dst.len() >= 64 * STEPS);
    let finite = table.fmt.finite();
    for j in 0..STEPS {
        prefetch(src, 32 * j);
        // SAFETY: 32 * (j + 1) <= 32 * STEPS <= src.len() (asserted): the 32 bytes are in bounds.
        let (c, mag, nan) = unsafe { load_codes(src.as_ptr().add(32 * j), finite) };
        if nan {
            let d = &mut dst[64 * j..64 * (j + 1)];
            computed_cold(table.fmt, &src[32 * j..32 * (j + 1)], d, table.k);
        } else {
            let (lo, hi) = bytes_with(c, mag, table, fixed);
            // SAFETY: 64 * (j + 1) <= dst.len() (asserted); when streaming dst is 32-byte
            // aligned (the caller's contract) and 64 * j keeps it so.
            unsafe { store_64(dst.as_mut_ptr().add(64 * j), lo, hi, stores) };
        }
    }
}

/// Codes `src` (of a row, starting at column `col`) times their tiles' scales `ks`, computed.
#[target_feature(enable = "avx2,fma")]
fn computed_tiles(fmt: Fp8, src: &[u8], dst: &mut [u8], col: usize, ks: &[f32], block: usize) {
    let mut done = 0;
    while done < src.len() {
        let at = col + done;
        let len = (block - at % block).min(src.len() - done);
        let d = &mut dst[2 * done..2 * (done + len)];
        computed(fmt, &src[done..done + len], d, ks[at / block]);
        done += len;
    }
}

/// [`fp8_to_bf16_scaled`] for e4m3, computing each result in registers (any `k`, any length).
#[target_feature(enable = "avx2,fma")]
fn e4m3_to_bf16_computed(src: &[u8], dst: &mut [u8], k: f32) {
    let n = src.len().min(dst.len() / 2);
    let kv = _mm256_set1_ps(k);
    // The subnormal codes m = 0..7 are m * 2^-9; `vpermps` reads this with the low 3 bits.
    let sub_table = _mm256_setr_ps(
        0.0,
        1.0 / 512.0,
        2.0 / 512.0,
        3.0 / 512.0,
        4.0 / 512.0,
        5.0 / 512.0,
        6.0 / 512.0,
        7.0 / 512.0,
    );
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= src.len(), so the 16 bytes at src[i..] are in bounds;
        // loadu has no alignment requirement.
        let bytes = unsafe { _mm_loadu_si128(src.as_ptr().add(i).cast()) };
        let lo = decode_scale(_mm256_cvtepu8_epi32(bytes), kv, sub_table);
        let hi = decode_scale(
            _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)),
            kv,
            sub_table,
        );
        // Every lane holds a value below 0x1_0000, so the unsigned-saturating pack is exact; it
        // interleaves 128-bit halves, which the 64-bit permute puts back in order.
        let packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0b11_01_10_00);
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(), so the 32 bytes at dst[2 * i..] are in
        // bounds; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(2 * i).cast(), packed) };
        i += 16;
    }
    for (s, d) in src[i..n].iter().zip(dst[2 * i..].chunks_exact_mut(2)) {
        let x = f32::from_bits(e4m3_to_f32_bits(*s)) * k;
        d.copy_from_slice(&f32_bits_to_bf16_bf(x.to_bits()).to_le_bytes());
    }
}

/// Eight codes (one per 32-bit lane) times `kv`, as bf16 bits in the low half of each lane.
#[target_feature(enable = "avx2,fma")]
fn decode_scale(c: __m256i, kv: __m256, sub_table: __m256) -> __m256i {
    let mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    let sign = _mm256_and_si256(_mm256_slli_epi32(c, 24), _mm256_set1_epi32(i32::MIN));
    // Normal codes: rebias the exponent from 7 to 127 in place.
    let normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    let sub = _mm256_permutevar8x32_ps(sub_table, mag);
    // mag - 8 is negative exactly for the subnormals; blendv reads that sign bit.
    let below = _mm256_castsi256_ps(_mm256_sub_epi32(mag, _mm256_set1_epi32(8)));
    let v = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, below));
    // The NaN code 0x7F decodes through `normal` to 0x43F0_0000; OR-ing 0x7FF0_0000 gives
    // exactly the NaN pattern of the reference (0x7FF0_0000).
    let nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x7FF0_0000)));
    let x = _mm256_castsi256_ps(_mm256_or_si256(v, sign));
    // A NaN code gives its own NaN (any finite or infinite scale); see the module notes for two.
    let p = _mm256_mul_ps(x, kv);
    // bf16 rounding as `f32_bits_to_bf16_bf`: add 0x7FFF plus the kept lsb, truncate.
    let w = _mm256_castps_si256(p);
    let hi = _mm256_srli_epi32(w, 16);
    let bias = _mm256_add_epi32(
        _mm256_and_si256(hi, _mm256_set1_epi32(1)),
        _mm256_set1_epi32(0x7FFF),
    );
    let rounded = _mm256_srli_epi32(_mm256_add_epi32(w, bias), 16);
    let is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
    let nan_out = _mm256_or_si256(
        _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)),
        _mm256_set1_epi32(0x7FC0),
    );
    _mm256_blendv_epi8(rounded, nan_out, is_nan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::avx2::test_scales as scales;
    use crate::dtype::{f32_to_bf16_bits, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, SimdLevel};

    const FORMATS: [Fp8; 2] = [Fp8::E4m3, Fp8::E5m2];

    fn decode(fmt: Fp8, c: u8) -> f32 {
        match fmt {
            Fp8::E4m3 => fp8_e4m3fn_to_f32(c),
            Fp8::E5m2 => fp8_e5m2_to_f32(c),
        }
    }

    /// Checks `got` (two bytes per code of `src`, code i scaled by `k_of(i)`) against the
    /// scalar reference.
    fn check(fmt: Fp8, src: &[u8], got: &[u8], k_of: impl Fn(usize) -> f32, what: &str) {
        for (i, (c, g)) in src.iter().zip(got.chunks_exact(2)).enumerate() {
            let k = k_of(i);
            let x = decode(fmt, *c);
            let g = u16::from_le_bytes([g[0], g[1]]);
            // Which NaN a product of two NaNs gives is not defined (LLVM may swap the operands);
            // only the quiet-NaN shape is.
            if x.is_nan() && k.is_nan() {
                assert_eq!(g & 0x7FFF, 0x7FC0, "{what}: code {c:#04x}");
                continue;
            }
            let want = f32_to_bf16_bits(x * k);
            assert_eq!(
                g,
                want,
                "{fmt:?} {what}: element {i} code {c:#04x} scale {k:e} ({:#010x})",
                k.to_bits()
            );
        }
    }

    /// The test scales plus the edges of the table's range and scales whose products round up
    /// into the next binade.
    fn table_scales() -> Vec<f32> {
        let mut ks = scales();
        for w in [
            0x0D80_0000u32,
            0x7180_0000,
            0x0D7F_FFFF,
            0x7180_0001,
            0x3FFF_FFFF,
            0x3F7F_FFFF,
        ] {
            ks.push(f32::from_bits(w));
            ks.push(-f32::from_bits(w));
        }
        ks
    }

    #[test]
    fn fp8_to_bf16_scaled_equals_the_reference_on_every_code() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every code nine times over (past the table's threshold), shifted by 0 and 3, so the
        // vector body, the tail and every lane position each see every code; runs without a
        // NaN code too, which take the table's fast path throughout.
        let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 9 + 35).collect();
        let no_nan: Vec<u8> = codes
            .iter()
            .map(|c| if c & 0x7F >= 0x7C { 0x3B } else { *c })
            .collect();
        for k in table_scales() {
            for src in [&codes[..], &codes[3..], &no_nan[..], &no_nan[5..]] {
                let mut got = vec![0u8; src.len() * 2];
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                unsafe { e4m3_to_bf16_computed(src, &mut got, k) };
                check(Fp8::E4m3, src, &got, |_| k, "computed");
                for (fmt, stores) in FORMATS
                    .map(|f| [(f, Stores::Cached), (f, Stores::Streaming)])
                    .concat()
                {
                    for off in [0usize, 2, 6, 1] {
                        let mut buf = vec![0u8; src.len() * 2 + 64];
                        let got = &mut buf[off..off + src.len() * 2];
                        // SAFETY: as above.
                        unsafe { fp8_to_bf16_scaled(fmt, src, got, k, stores) };
                        check(
                            fmt,
                            src,
                            got,
                            |_| k,
                            &format!("table {stores:?} offset {off}"),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_to_bf16_blocks_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let all = table_scales();
        // Shapes for every way a row meets its tiles: a partial last tile of several steps, of
        // under one step, whole 128-code tiles (the four-step path), rows starting inside a
        // block row and block rows ending inside the run, blocks of one and two steps, and
        // blocks under a step; the last shape's scales have no table at all.
        for (rows, cols, block, first_row) in [
            (300usize, 200usize, 128usize, 0usize),
            (70, 333, 64, 37),
            (5, 40, 128, 250),
            (33, 97, 32, 5),
            (40, 100, 16, 3),
            (131, 512, 128, 126),
            (9, 1000, 128, 0),
            (20, 384, 256, 250),
            (6, 300, 128, 0),
        ] {
            let tiles = cols.div_ceil(block);
            let grid = (first_row + rows).div_ceil(block) * tiles;
            // Cycle through the scale set (NaN and infinity included) over the tiles; the last
            // shape with scales the tables do not hold for only.
            let ks: Vec<f32> = if cols == 300 {
                vec![f32::from_bits(0x0D7F_FFFF); grid]
            } else {
                (0..grid).map(|t| all[(t * 7) % all.len()]).collect()
            };
            let src: Vec<u8> = (0..rows * cols).map(|i| (i * 37 + i / 255) as u8).collect();
            let k_of = |i: usize| {
                let (r, col) = (first_row + i / cols, i % cols);
                ks[r / block * tiles + col / block]
            };
            for (fmt, stores) in FORMATS
                .map(|f| [(f, Stores::Cached), (f, Stores::Streaming)])
                .concat()
            {
                // Offsets from a 32-byte boundary: 0 lets streamed rows start on a step (for
                // the rows whose length keeps them there), the others shift the steps across
                // the tile edges.
                for off in [0usize, 2, 6, 1, 32, 64] {
                    let mut buf = vec![0u8; src.len() * 2 + 128];
                    let off = buf.as_ptr().align_offset(32) + off;
                    let got = &mut buf[off..off + src.len() * 2];
                    let at = (first_row, cols);
                    // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                    unsafe { fp8_to_bf16_blocks(fmt, &src, got, at, &ks, block, stores) };
                    check(
                        fmt,
                        &src,
                        got,
                        k_of,
                        &format!("blocks {rows}x{cols} {stores:?} {off}"),
                    );
                }
            }
        }
    }
}
