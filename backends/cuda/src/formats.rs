//! Which GGUF weight formats run natively on the device, and the activation format of
//! each (spec §8.1; the same table as `pn_ops::quant::vec_dot_type`).

use pn_ops::GgmlType;

/// How a weight of a format lives on the device.
#[derive(Clone, Debug, PartialEq)]
pub enum Residency {
    /// Raw GGUF blocks, read by the `mm_<fmt>` / `get_rows_<fmt>` kernels.
    Native,
    /// Dequantized on the host at upload and stored as F16 (the codebook IQ formats,
    /// Q8_K): results then follow f16 weights × f16 activations, not the CPU's q8_K dot.
    F16Fallback,
    /// Not a weight format at all.
    No(String),
}

pub fn residency(ty: GgmlType) -> Residency {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K
        | IQ4NL | IQ4XS | MXFP4 => Residency::Native,
        Q8K | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ1M => Residency::F16Fallback,
        Q8_1 | TQ1_0 | TQ2_0 | I8 | I16 | I32 | I64 | F64 => {
            Residency::No(format!("weight type {} is unsupported on cuda", ty.name()))
        }
    }
}

/// The kernel suffix of a natively stored format (`mm_<suffix>`, `get_rows_<suffix>`).
pub fn suffix(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        IQ4NL => "iq4_nl",
        IQ4XS => "iq4_xs",
        MXFP4 => "mxfp4",
        _ => return None,
    })
}

/// Activation format of a device weight format and its block geometry
/// (elements per block, bytes per block).
pub fn act_format(ty: GgmlType) -> (GgmlType, usize, usize) {
    let at = pn_ops::quant::vec_dot_type(ty);
    let (qk, bytes) = match at {
        GgmlType::F32 => (1, 4),
        GgmlType::F16 | GgmlType::BF16 => (1, 2),
        GgmlType::Q8_0 => (32, 34),
        GgmlType::Q8_1 => (32, 36),
        _ => (256, 292), // Q8_K
    };
    (at, qk, bytes)
}
