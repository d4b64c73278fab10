//! Scalar dequantization of the GGML blocks, one element at a time, written from the layouts as
//! ggml defines them: the bits every faster path must give. Each element is computed with the
//! same f32 operations, in the same order, as the `gguf` package's numpy reference (`d * q`,
//! `(d * sc) * q - dmin * m`, ...), never fused, so the two agree bit for bit.

use super::super::half::f16_bits_to_f32;
use super::super::DType;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Where a block type keeps its f16 scale (and minimum) fields, in bytes from the block's start
/// (none for a type that is not a block type).
pub fn scale_fields(t: DType) -> &'static [usize] {
    match t {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[],
    }
}

/// The 6-bit scale and minimum of group `g` (0..8) of a Q4_K or Q5_K super-block, from its 12
/// packed bytes.
pub(crate) fn k_scale_min(scales: &[u8], g: usize) -> (u8, u8) {
    if g < 4 {
        (scales[g] & 63, scales[g + 4] & 63)
    } else {
        let sc = (scales[g + 4] & 0x0F) | ((scales[g - 4] >> 6) << 4);
        let m = (scales[g + 4] >> 4) | ((scales[g] >> 6) << 4);
        (sc, m)
    }
}

/// The signed 6-bit scale of group `g` (0..16) of a Q3_K super-block, from its 12 packed bytes.
pub(crate) fn q3k_scale(scales: &[u8], g: usize) -> i8 {
    let low = if g < 8 {
        scales[g] & 0x0F
    } else {
        scales[g - 8] >> 4
    };
    let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Element `i` of one block of `dtype` (`block` holds exactly one block).
pub(crate) fn element(dtype: DType, block: &[u8], i: usize) -> f32 {
    match dtype {
        DType::Q8_0 => block[2 + i] as i8 as f32 * f16_at(block, 0),
        DType::Q4_0 => {
            let q = (block[2 + i % 16] >> (4 * (i / 16))) & 0x0F;
            f16_at(block, 0) * (i32::from(q) - 8) as f32
        }
        DType::Q4_1 => {
            let q = (block[4 + i % 16] >> (4 * (i / 16))) & 0x0F;
            f16_at(block, 0) * f32::from(q) + f16_at(block, 2)
        }
        DType::Q5_0 => {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let low = (block[6 + i % 16] >> (4 * (i / 16))) & 0x0F;
            let q = u32::from(low) | (((qh >> i) & 1) << 4);
            f16_at(block, 0) * (q as i32 - 16) as f32
        }
        DType::Q5_1 => {
            let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
            let low = (block[8 + i % 16] >> (4 * (i / 16))) & 0x0F;
            let q = u32::from(low) | (((qh >> i) & 1) << 4);
            f16_at(block, 0) * q as f32 + f16_at(block, 2)
        }
        DType::Q2K => {
            let (half, shift, l) = (i / 128, (i % 128) / 32, i % 32);
            let q = (block[16 + half * 32 + l] >> (2 * shift)) & 3;
            let sc = block[i / 16];
            let dl = f16_at(block, 80) * f32::from(sc & 0x0F);
            let ml = f16_at(block, 82) * f32::from(sc >> 4);
            dl * f32::from(q) - ml
        }
        DType::Q3K => {
            let (half, shift, l) = (i / 128, (i % 128) / 32, i % 32);
            let low = (block[32 + half * 32 + l] >> (2 * shift)) & 3;
            let high = (block[l] >> (i / 32)) & 1;
            // A clear high bit subtracts 4: the mask holds the complement of the top bit.
            let q = low as i8 - if high == 0 { 4 } else { 0 };
            let dl = f16_at(block, 108) * f32::from(q3k_scale(&block[96..108], i / 16));
            dl * f32::from(q)
        }
        DType::Q4K | DType::Q5K => {
            let (sc, m) = k_scale_min(&block[4..16], i / 32);
            let (chunk, nib, l) = (i / 64, (i % 64) / 32, i % 32);
            let qs = if dtype == DType::Q4K { 16 } else { 48 };
            let mut q = (block[qs + chunk * 32 + l] >> (4 * nib)) & 0x0F;
            if dtype == DType::Q5K {
                q |= ((block[16 + l] >> (i / 32)) & 1) << 4;
            }
            let d = f16_at(block, 0) * f32::from(sc);
            let dm = f16_at(block, 2) * f32::from(m);
            d * f32::from(q) - dm
        }
        DType::Q6K => {
            let (half, r) = (i / 128, i % 128);
            let low = (block[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
            let high = (block[128 + half * 32 + r % 32] >> (2 * (r / 32))) & 3;
            let q = (low | (high << 4)) as i8 - 32;
            let d = f16_at(block, 208) * f32::from(block[192 + i / 16] as i8);
            d * f32::from(q)
        }
        _ => f32::NAN,
    }
}

/// Dequantizes whole blocks of `dtype` to f32, element by element: the reference the kernels
/// are tested against. `None` when `dtype` is not a block type or `src` is not whole blocks.
pub fn dequantize_reference(src: &[u8], dtype: DType) -> Option<Vec<f32>> {
    if !dtype.is_block() || !src.len().is_multiple_of(dtype.size()) {
        return None;
    }
    let n = dtype.block_elems();
    Some(
        src.chunks_exact(dtype.size())
            .flat_map(|b| (0..n).map(move |i| element(dtype, b, i)))
            .collect(),
    )
}
