//! fp8 -> 16-bit kernels with a scale.

use core::arch::x86_64::*;

use super::cast::{pack_16, round_bf16};
use super::{store, Stores};
use crate::dtype::cast::f32_bits_to_bf16_bf;
use crate::dtype::fp8::e4m3_to_f32_bits;

/// Below this many codes building a table (sixteen scalar products) costs more than it saves;
/// at least 32, a whole lookup step.
const TABLE_MIN: usize = 256;

/// Whether [`e4m3_to_bf16_scaled`] looks `n` codes times `k` up in a table (else it computes).
pub(crate) fn uses_table(n: usize, k: f32) -> bool {
    n >= TABLE_MIN && Table::holds(k)
}

/// e4m3fn codes times `k`, rounded to bf16: equal to decoding each code to f32 exactly,
/// multiplying by `k` in f32 and rounding to nearest even (NaN -> `0x7FC0 | sign`). `dst` holds
/// two bytes per code of `src`. With `k` = 1 it is the plain conversion.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn e4m3_to_bf16_scaled(src: &[u8], dst: &mut [u8], k: f32, stores: Stores) {
    let n = src.len().min(dst.len() / 2);
    if uses_table(n, k) {
        let table = Table::new(k);
        let (head, stores) = stores.head(dst.as_ptr(), 2, n);
        // The head and the tail (under 32 codes each) come out of whole 32-code windows, which
        // n >= TABLE_MIN >= 32 guarantees.
        let one = (Some(&table), Some(&table), 32);
        let computed = |s: &[u8], d: &mut [u8]| e4m3_to_bf16_computed(s, d, k);
        window(&src[..32], 0, &mut dst[..2 * head], one, computed);
        let done = head + lookup(&src[head..n], &mut dst[2 * head..2 * n], &table, stores);
        let (tail, rest) = (&mut dst[2 * done..2 * n], n - done);
        window(&src[n - 32..n], 32 - rest, tail, one, computed);
    } else {
        e4m3_to_bf16_computed(&src[..n], &mut dst[..2 * n], k);
    }
}

/// The results of one scale `k` as four 16-byte `vpshufb` tables (each in both 128-bit halves).
///
/// A normal code is `(1 + j/8) 2^(e-7)` (exponent field e, mantissa j), so its product with `k`
/// is that of `1 + j/8` with its exponent moved by `e - 7`; while every product stays a normal
/// f32 (|k| within 2^-100..2^100, [`Table::holds`]), moving the exponent commutes with both
/// roundings (to f32, then to bf16), so the bf16 result is `B[j] + ((e - 7) << 7)`, with
/// `B[j] = bf16((1 + j/8) k)`. The eight subnormal codes get their own eight results `S[m]`.
///
/// [`lookup`] indexes the normal table with `mag - 8`, whose low nibble is `j` and the
/// exponent's low bit (flipped), and whose sign bit (set for the subnormals) makes `vpshufb`
/// give zero; the subnormal table with `mag + 0x78`, which is the other way round. So an entry
/// of the normal table holds `B[j] + ((e & 1) - 7) << 7`, and the rest of the exponent,
/// `(e >> 1) << 8`, and the code's sign are added to the high byte by a third, fixed lookup.
struct Table {
    /// The scale.
    k: f32,
    /// Low and high bytes of the normal results, by `(mag - 8) & 15`.
    normal: [__m256i; 2],
    /// Low and high bytes of the subnormal results, by `(mag + 8) & 15`.
    sub: [__m256i; 2],
}

impl Table {
    /// Whether the exponent-moving identity holds for every code times `k`.
    fn holds(k: f32) -> bool {
        let a = k.abs();
        // False for NaN; 2^-100 and 2^100 are exact f32 constants.
        (f32::from_bits(0x0D80_0000)..=f32::from_bits(0x7180_0000)).contains(&a)
    }

    /// The tables of `k`; [`Table::holds`] must hold for `k`. Built in registers: a table per
    /// row of a per-row scale is built 8192 codes apart, often enough to show.
    #[target_feature(enable = "avx2,fma")]
    fn new(k: f32) -> Table {
        let kv = _mm256_set1_ps(k);
        // The codes' values are exact f32 constants (1 + j/8 for 0x38 | j, m/512 for m < 8), so
        // each product is the reference's `decode(code) * k`, rounded as `f32_bits_to_bf16_bf`
        // does (no NaN: k is finite).
        let units = _mm256_setr_ps(1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875);
        let subs = _mm256_mul_ps(
            _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
            _mm256_set1_ps(1.0 / 512.0),
        );
        let b = round_bf16(_mm256_castps_si256(_mm256_mul_ps(units, kv)));
        let s = round_bf16(_mm256_castps_si256(_mm256_mul_ps(subs, kv)));
        // Entry j has the exponent's low bit 1, entry 8 + j has it 0: B[j] + ((bit - 7) << 7).
        // Every B[j] has an exponent of at least 27 (|k| >= 2^-100), so no difference is
        // negative and the saturating pack is exact.
        let normal = pack_16(
            _mm256_sub_epi32(b, _mm256_set1_epi32(6 << 7)),
            _mm256_sub_epi32(b, _mm256_set1_epi32(7 << 7)),
        );
        // The subnormal results sit at entries 8..=15.
        let sub = pack_16(_mm256_setzero_si256(), s);
        Table {
            k,
            normal: split_bytes(normal),
            sub: split_bytes(sub),
        }
    }
}

/// Sixteen 16-bit values as their low bytes and their high bytes, each 16-byte table in both
/// 128-bit halves (as `vpshufb` reads it).
#[target_feature(enable = "avx2,fma")]
fn split_bytes(v: __m256i) -> [__m256i; 2] {
    // Within each half: the even (low) bytes, then the odd (high) ones.
    let order = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
        7, 9, 11, 13, 15,
    );
    // low bytes 0-7, low 8-15, high 0-7, high 8-15 in 64-bit quarters.
    let q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, order), 0b11_01_10_00);
    [
        _mm256_permute2x128_si256(q, q, 0x00),
        _mm256_permute2x128_si256(q, q, 0x11),
    ]
}

/// The bf16 results of the 32 codes `c` (`mag` = `c & 0x7F`, no NaN among them) by `table`,
/// as two registers of low and high bytes in code order.
#[target_feature(enable = "avx2,fma")]
fn bytes_of(c: __m256i, mag: __m256i, table: &Table) -> (__m256i, __m256i) {
    let [nl, nh] = table.normal;
    let [sl, sh] = table.sub;
    // The high byte's addend by `code >> 4` = sign, then the exponent's upper three bits.
    let addend = _mm256_setr_epi8(
        0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121, 0, 1, 2, 3, 4, 5,
        6, 7, -128, -127, -126, -125, -124, -123, -122, -121,
    );
    let normal = _mm256_sub_epi8(mag, _mm256_set1_epi8(8));
    let sub = _mm256_add_epi8(mag, _mm256_set1_epi8(0x78));
    let lo = _mm256_or_si256(
        _mm256_shuffle_epi8(nl, normal),
        _mm256_shuffle_epi8(sl, sub),
    );
    let hi = _mm256_or_si256(
        _mm256_shuffle_epi8(nh, normal),
        _mm256_shuffle_epi8(sh, sub),
    );
    // Bytes shifted by four within 16-bit lanes: the low nibble is the byte's own high one.
    let top = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi8(0x0F));
    (lo, _mm256_add_epi8(hi, _mm256_shuffle_epi8(addend, top)))
}

/// The 32 codes at `src` and their magnitudes, and whether one of them is a NaN.
///
/// # Safety
/// The 32 bytes at `src` are readable.
#[target_feature(enable = "avx2,fma")]
unsafe fn load_codes(src: *const u8) -> (__m256i, __m256i, bool) {
    // SAFETY: the caller's contract; loadu has no alignment requirement.
    let c = unsafe { _mm256_loadu_si256(src.cast()) };
    let mag = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
    let nan = _mm256_movemask_epi8(_mm256_cmpeq_epi8(mag, _mm256_set1_epi8(0x7F))) != 0;
    (c, mag, nan)
}

/// Interleaves 32 low and high bytes into the 64 bytes at `d`.
///
/// # Safety
/// The 64 bytes at `d` are writable, and 32-byte aligned when streaming.
#[target_feature(enable = "avx2,fma")]
unsafe fn store_64(d: *mut u8, lo: __m256i, hi: __m256i, stores: Stores) {
    // Byte unpacks work within 128-bit halves: a = codes 0-7 | 16-23, b = 8-15 | 24-31.
    let a = _mm256_unpacklo_epi8(lo, hi);
    let b = _mm256_unpackhi_epi8(lo, hi);
    // SAFETY: the caller's contract.
    unsafe {
        store(d, _mm256_permute2x128_si256(a, b, 0x20), stores);
        store(d.add(32), _mm256_permute2x128_si256(a, b, 0x31), stores);
    }
}

/// Looks up the codes of `src` in `table` into `dst` (two bytes per code), 32 at a time;
/// returns how many it did (the rest, under 32, is the caller's). With streaming stores `dst`
/// is 32-byte aligned.
#[target_feature(enable = "avx2,fma")]
fn lookup(src: &[u8], dst: &mut [u8], table: &Table, stores: Stores) -> usize {
    let n = src.len().min(dst.len() / 2);
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: i + 32 <= n <= src.len(): the 32 bytes at src[i..] are in bounds.
        let (c, mag, nan) = unsafe { load_codes(src.as_ptr().add(i)) };
        if nan {
            // A NaN code (rare; the identity does not cover it): these 32 are computed.
            e4m3_to_bf16_computed(&src[i..i + 32], &mut dst[2 * i..2 * i + 64], table.k);
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

/// Whole rows `first_row..` of an e4m3fn -> bf16 expansion with `block` x `block` scales
/// (`scales` row-major over the tile grid, as `Scale::Block`). A tile's table is shared by
/// `block` rows, so each block row builds one per tile and every row of it looks them up.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn e4m3_to_bf16_blocks(
    src: &[u8],
    dst: &mut [u8],
    cols: usize,
    first_row: usize,
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
                .map(|&k| Table::holds(k).then(|| Table::new(k)))
                .collect();
            tables_of = block_row;
        }
        if block < 32 {
            computed_tiles(s, d, 0, ks, block);
        } else {
            row_of_tiles(s, d, ks, &tables, block, stores);
        }
    }
}

/// The results of 32 codes whose first `before` take table `a` and the rest table `b` (a step
/// across a tile edge looks up both tables and takes each code from its own); `None` for a NaN
/// code or a tile without a table.
#[target_feature(enable = "avx2,fma")]
fn step(
    codes: (__m256i, __m256i, bool),
    a: Option<&Table>,
    b: Option<&Table>,
    before: usize,
) -> Option<(__m256i, __m256i)> {
    let (c, mag, nan) = codes;
    let (a, b) = (a?, b?);
    if nan {
        return None;
    }
    let (lo, hi) = bytes_of(c, mag, a);
    if before >= 32 {
        return Some((lo, hi));
    }
    let iota = _mm256_setr_epi8(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
        25, 26, 27, 28, 29, 30, 31,
    );
    let (lo_b, hi_b) = bytes_of(c, mag, b);
    let first = _mm256_cmpgt_epi8(_mm256_set1_epi8(before as i8), iota);
    Some((
        _mm256_blendv_epi8(lo_b, lo, first),
        _mm256_blendv_epi8(hi_b, hi, first),
    ))
}

/// The tables of the 32 codes at column `i` of a row of `block`-code tiles (at least 32) and
/// how many of them are before the tile edge (32: none is after it), as [`step`] takes them.
fn tiles_at(
    tables: &[Option<Table>],
    i: usize,
    block: usize,
) -> (Option<&Table>, Option<&Table>, usize) {
    let (t0, t1) = (i / block, (i + 31) / block);
    let table = |t: usize| tables.get(t).and_then(Option::as_ref);
    let before = if t1 == t0 { 32 } else { t1 * block - i };
    (table(t0), table(t1), before)
}

/// Codes `at..` of the 32-code window `win` into `dst` (which holds fewer than 32 results),
/// through a stack buffer: the head before aligned stores and the tail after them, by table
/// rather than one at a time. The tables are [`step`]'s; where it gives `None`,
/// `fallback(codes, dst)` computes them.
#[target_feature(enable = "avx2,fma")]
fn window(
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
    let codes = unsafe { load_codes(win.as_ptr()) };
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

/// One row of [`e4m3_to_bf16_blocks`] (`block` >= 32): the row is one run of 32-code steps
/// aligned for streaming stores, not one run per tile (a tile's 256 bytes would leave cache
/// lines half streamed and half stored plainly, which stalls).
#[target_feature(enable = "avx2,fma")]
fn row_of_tiles(
    s: &[u8],
    d: &mut [u8],
    ks: &[f32],
    tables: &[Option<Table>],
    block: usize,
    stores: Stores,
) {
    let n = s.len().min(d.len() / 2);
    if n < 32 {
        computed_tiles(&s[..n], &mut d[..2 * n], 0, ks, block);
        return;
    }
    let (head, stores) = stores.head(d.as_ptr(), 2, n);
    let fallback = |s: &[u8], d: &mut [u8]| computed_tiles(s, d, 0, ks, block);
    window(
        &s[..32],
        0,
        &mut d[..2 * head],
        tiles_at(tables, 0, block),
        fallback,
    );
    let mut i = head;
    // The tile of column i and the column of its right edge, kept as i steps (a division per
    // step would cost as much as the lookup).
    let (mut t, mut edge) = (i / block, (i / block + 1) * block);
    while i + 32 <= n {
        // SAFETY: i + 32 <= n <= s.len(): the 32 bytes at s[i..] are in bounds.
        let codes = unsafe { load_codes(s.as_ptr().add(i)) };
        let a = tables.get(t).and_then(Option::as_ref);
        let b = tables.get(t + 1).and_then(Option::as_ref);
        let (b, before) = if i + 32 <= edge {
            (a, 32)
        } else {
            (b, edge - i)
        };
        match step(codes, a, b, before) {
            // SAFETY: 2 * (i + 32) <= 2 * n <= d.len(): the 64 bytes at d[2 * i..] are in
            // bounds; aligned when streaming (`head` aligned d + 2 * head; steps add 64).
            Some((lo, hi)) => unsafe { store_64(d.as_mut_ptr().add(2 * i), lo, hi, stores) },
            // A NaN code, or a scale without a table: computed, tile by tile.
            None => computed_tiles(&s[i..i + 32], &mut d[2 * i..2 * i + 64], i, ks, block),
        }
        i += 32;
        if i >= edge {
            t += 1;
            edge += block;
        }
    }
    let (start, rest) = (n - 32, n - i);
    let fallback = |s: &[u8], d: &mut [u8]| computed_tiles(s, d, i, ks, block);
    let tail = &mut d[2 * i..2 * n];
    window(
        &s[start..n],
        32 - rest,
        tail,
        tiles_at(tables, start, block),
        fallback,
    );
}

/// Codes `src` (of a row, starting at column `col`) times their tiles' scales `ks`, computed.
#[target_feature(enable = "avx2,fma")]
fn computed_tiles(src: &[u8], dst: &mut [u8], col: usize, ks: &[f32], block: usize) {
    let mut done = 0;
    while done < src.len() {
        let at = col + done;
        let len = (block - at % block).min(src.len() - done);
        let d = &mut dst[2 * done..2 * (done + len)];
        e4m3_to_bf16_computed(&src[done..done + len], d, ks[at / block]);
        done += len;
    }
}

/// [`e4m3_to_bf16_scaled`] computing each result in registers (any `k`, any length).
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
    use crate::dtype::{f32_to_bf16_bits, fp8_e4m3fn_to_f32, SimdLevel};

    /// Checks `got` (two bytes per code of `src`, code i scaled by `k_of(i)`) against the
    /// scalar reference.
    fn check(src: &[u8], got: &[u8], k_of: impl Fn(usize) -> f32, what: &str) {
        for (i, (c, g)) in src.iter().zip(got.chunks_exact(2)).enumerate() {
            let k = k_of(i);
            let x = fp8_e4m3fn_to_f32(*c);
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
                "{what}: element {i} code {c:#04x} scale {k:e} ({:#010x})",
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
    fn e4m3_to_bf16_scaled_equals_the_reference_on_every_code() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every code nine times over (past the table's threshold), shifted by 0 and 3, so the
        // vector body, the tail and every lane position each see every code; runs without a
        // NaN code too, which take the table's fast path throughout.
        let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 9 + 35).collect();
        let no_nan: Vec<u8> = codes
            .iter()
            .map(|c| if c & 0x7F == 0x7F { 0x7E } else { *c })
            .collect();
        for k in table_scales() {
            for src in [&codes[..], &codes[3..], &no_nan[..], &no_nan[5..]] {
                let mut got = vec![0u8; src.len() * 2];
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                unsafe { e4m3_to_bf16_computed(src, &mut got, k) };
                check(src, &got, |_| k, "computed");
                for stores in [Stores::Cached, Stores::Streaming] {
                    for off in [0usize, 2, 6, 1] {
                        let mut buf = vec![0u8; src.len() * 2 + 64];
                        let got = &mut buf[off..off + src.len() * 2];
                        // SAFETY: as above.
                        unsafe { e4m3_to_bf16_scaled(src, got, k, stores) };
                        check(src, got, |_| k, &format!("table {stores:?} offset {off}"));
                    }
                }
            }
        }
    }

    #[test]
    fn e4m3_to_bf16_blocks_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let all = table_scales();
        for (rows, cols, block, first_row) in [
            (300usize, 200usize, 128usize, 0usize),
            (70, 333, 64, 37),
            (5, 40, 128, 250),
            (33, 97, 32, 5),
            (40, 100, 16, 3),
        ] {
            let tiles = cols.div_ceil(block);
            let grid = (first_row + rows).div_ceil(block) * tiles;
            // Cycle through the scale set (NaN and infinity included) over the tiles.
            let ks: Vec<f32> = (0..grid).map(|t| all[(t * 7) % all.len()]).collect();
            let src: Vec<u8> = (0..rows * cols).map(|i| (i * 37 + i / 255) as u8).collect();
            let k_of = |i: usize| {
                let (r, col) = (first_row + i / cols, i % cols);
                ks[r / block * tiles + col / block]
            };
            for stores in [Stores::Cached, Stores::Streaming] {
                for off in [0usize, 2, 6, 1] {
                    let mut buf = vec![0u8; src.len() * 2 + 64];
                    let got = &mut buf[off..off + src.len() * 2];
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { e4m3_to_bf16_blocks(&src, got, cols, first_row, &ks, block, stores) };
                    check(
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
