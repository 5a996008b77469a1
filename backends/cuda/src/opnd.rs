//! Op operands on the device, the same for both protocols: an activation in a device
//! buffer (a temporary of the host path or a slot of the resident path) with its meta
//! and, for i32 values the host knows (the runner's token ids / positions, or host-path
//! inputs), the host copy; or a weight (uploaded once and cached by the device).

use crate::device::{DevWeight, Device};
use crate::exec::Buf;
use crate::CudaError;
use pn_ops::{DType, Op, OpError, Shape, TensorMeta, WeightView};
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
pub enum Opnd<'a> {
    Act {
        buf: Buf,
        meta: TensorMeta,
        /// The values, when the host has them (i32 inputs uploaded from the host).
        host: Option<&'a [i32]>,
    },
    Weight(WeightView<'a>),
}

pub(crate) fn bad(msg: impl Into<String>) -> CudaError {
    CudaError::Unsupported(msg.into())
}

impl<'a> Opnd<'a> {
    pub fn meta(&self) -> TensorMeta {
        match self {
            Opnd::Act { meta, .. } => *meta,
            Opnd::Weight(w) => TensorMeta {
                shape: w.shape,
                dtype: DType::Weight(w.ty),
            },
        }
    }
    /// An activation's buffer and shape.
    pub fn act(&self) -> Result<(Buf, Shape), CudaError> {
        match self {
            Opnd::Act { buf, meta, .. } => Ok((*buf, meta.shape)),
            Opnd::Weight(w) => Err(bad(format!(
                "expected an activation, found weight {}",
                w.name
            ))),
        }
    }
    /// An f32 activation's buffer.
    pub fn f32(&self) -> Result<Buf, CudaError> {
        match self {
            Opnd::Act { meta, .. } if meta.dtype != DType::F32 => {
                Err(bad("expected an f32 activation"))
            }
            _ => Ok(self.act()?.0),
        }
    }
    /// An i32 activation's buffer.
    pub fn i32(&self) -> Result<Buf, CudaError> {
        match self {
            Opnd::Act { meta, .. } if meta.dtype != DType::I32 => {
                Err(bad("expected an i32 activation"))
            }
            _ => Ok(self.act()?.0),
        }
    }
    /// The host copy of an i32 activation, if the host has it.
    pub fn host(&self) -> Option<&'a [i32]> {
        match self {
            Opnd::Act { host, .. } => *host,
            Opnd::Weight(_) => None,
        }
    }
    pub fn weight(&self) -> Result<WeightView<'a>, CudaError> {
        match self {
            Opnd::Weight(w) => Ok(*w),
            Opnd::Act { .. } => Err(bad("expected a weight")),
        }
    }
}

/// An f32 operand that may be an activation or a small weight (norm / conv / broadcast
/// operand, cached on the device as f32): its buffer and shape. The `Arc` keeps the
/// weight alive (it is also cached for the device's lifetime).
pub fn f32_any(
    d: &Device,
    o: &Opnd<'_>,
) -> Result<(Buf, Shape, Option<Arc<DevWeight>>), CudaError> {
    match o {
        Opnd::Act { .. } => {
            let (b, s) = o.act()?;
            Ok((o.f32().map(|_| b)?, s, None))
        }
        Opnd::Weight(w) => {
            let dw = d.weight_f32(w)?;
            Ok((dw.ptr, w.shape, Some(dw)))
        }
    }
}

/// Out-of-range ids are an error where the host knows them (the device kernels write NaN
/// for them instead of reading out of bounds).
pub fn check_ids(ids: Option<&[i32]>, limit: usize, what: &str) -> Result<(), CudaError> {
    match ids.and_then(|ids| ids.iter().find(|&&i| i < 0 || i as usize >= limit)) {
        Some(i) => Err(CudaError::Driver(format!(
            "{what} {i} out of range ({limit})"
        ))),
        None => Ok(()),
    }
}

/// The resident path's form of `pn_ops::reference::common::validate`: not a leaf, every
/// weight holds its row bytes in a supported format, `Op::infer` gives `out`. (Activation
/// lengths are the slot metas the runner passes; their buffers are checked against the
/// reservations by the slot table.)
pub fn validate(op: &Op, ins: &[Opnd<'_>], out: &TensorMeta) -> Result<(), OpError> {
    let k = op.kind();
    if op.is_leaf() {
        return Err(OpError::Invalid {
            op: k,
            msg: "leaves are provided by the runner, not executed".into(),
        });
    }
    for o in ins {
        if let Opnd::Weight(w) = o {
            pn_ops::reference::common::check_weight(k, w)?;
        }
    }
    let metas: Vec<TensorMeta> = ins.iter().map(Opnd::meta).collect();
    let got = op.infer(&metas)?;
    if got != *out {
        return Err(OpError::Shape {
            op: k,
            expected: got.to_string(),
            found: out.to_string(),
        });
    }
    Ok(())
}

/// Bytes of a value of `meta` in a buffer (f32 / i32: 4 per element).
pub fn value_bytes(meta: &TensorMeta) -> Result<usize, String> {
    match meta.dtype {
        DType::F32 | DType::I32 => Ok(4 * meta.shape.numel()),
        DType::Weight(t) => Err(format!("a {t} weight is not a slot value")),
    }
}

/// The token axis of a value of `t` tokens (the outermost dim that is not 1, which must
/// be `t`), as `pn_engine::slots` slices values per sequence.
pub fn token_axis(s: &Shape, t: usize) -> Result<usize, String> {
    match (0..4).rev().find(|&i| s.0[i] != 1) {
        Some(a) if s.0[a] == t => Ok(a),
        _ => Err(format!("{s:?} has no token axis of {t}")),
    }
}

/// Tokens `[t0, t0+n)` of a value of shape `s` holding `t` tokens (token axis outermost,
/// so the slice is contiguous): its shape and its first element and element count.
pub fn token_slice(
    s: &Shape,
    t: usize,
    t0: usize,
    n: usize,
) -> Result<(Shape, usize, usize), String> {
    if t0 + n > t {
        return Err(format!("tokens {t0}..{} of {t}", t0 + n));
    }
    let a = token_axis(s, t)?;
    let per = s.numel() / t.max(1);
    let mut shape = *s;
    shape.0[a] = n;
    Ok((shape, t0 * per, n * per))
}

/// Sequence `t0..t0+n`'s part of operand `o` (a pass of `t` tokens); weights unchanged.
pub fn slice_opnd<'a>(o: &Opnd<'a>, t: usize, t0: usize, n: usize) -> Result<Opnd<'a>, String> {
    match o {
        Opnd::Weight(_) => Ok(*o),
        Opnd::Act { buf, meta, host } => {
            let (shape, off, len) = token_slice(&meta.shape, t, t0, n)?;
            Ok(Opnd::Act {
                buf: buf.at(4 * off, 4 * len),
                meta: TensorMeta {
                    shape,
                    dtype: meta.dtype,
                },
                host: host.and_then(|h| h.get(off..off + len)),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_slices_match_the_engine() {
        // [D, H, T] with T = 5 tokens: sequence 2..4 is 2 tokens, D·H elements each
        let s = Shape([8, 4, 5, 1]);
        assert_eq!(token_axis(&s, 5), Ok(2));
        assert_eq!(
            token_slice(&s, 5, 2, 2),
            Ok((Shape([8, 4, 2, 1]), 2 * 32, 2 * 32))
        );
        // [n, T]
        let s = Shape([16, 3, 1, 1]);
        assert_eq!(token_slice(&s, 3, 1, 1), Ok((Shape([16, 1, 1, 1]), 16, 16)));
        // positions [T]
        assert_eq!(
            token_slice(&Shape([4, 1, 1, 1]), 4, 3, 1),
            Ok((Shape([1, 1, 1, 1]), 3, 1))
        );
        assert!(
            token_slice(&Shape([4, 2, 1, 1]), 4, 0, 1).is_err(),
            "outermost dim is not the token axis"
        );
        assert!(token_slice(&s, 3, 2, 2).is_err(), "past the end");
        let buf = Buf {
            ptr: 0x1000,
            bytes: 4 * 48,
        };
        let h = [0, 1, 2, 3, 4, 5];
        let o = Opnd::Act {
            buf,
            meta: TensorMeta {
                shape: Shape([2, 3, 1, 1]),
                dtype: DType::I32,
            },
            host: Some(&h),
        };
        let Opnd::Act { buf: b, meta, host } = slice_opnd(&o, 3, 1, 2).unwrap() else {
            panic!()
        };
        assert_eq!(
            b,
            Buf {
                ptr: 0x1000 + 8,
                bytes: 16
            }
        );
        assert_eq!(meta.shape, Shape([2, 2, 1, 1]));
        assert_eq!(host, Some(&h[2..6]));
    }

    #[test]
    fn value_bytes_of_metas() {
        let m = |dtype| TensorMeta {
            shape: Shape([3, 2, 1, 1]),
            dtype,
        };
        assert_eq!(value_bytes(&m(DType::F32)), Ok(24));
        assert_eq!(value_bytes(&m(DType::I32)), Ok(24));
        assert!(value_bytes(&m(DType::Weight(pn_ops::GgmlType::Q4_0))).is_err());
    }
}
