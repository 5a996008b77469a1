//! A device layer state as a whole ([`DevState`]): uploaded (into new buffers, or into
//! the ones its key holds when the geometry is the same, so a slot's row keeps its
//! addresses), downloaded, reset, snapshot, copied on the device (a fork, or into a held
//! state in place). The per-kind buffers and their parts are devstate.rs's.

use crate::device::{ptr_of, Device};
use crate::devstate::{holds, kv_geometry, mismatch, zero, DevKv, DevRec, DevState};
use crate::CudaError;
use cudarc::driver::{CudaSlice, DeviceRepr};
use pn_ops::{KvType, LayerSnapshot, LayerState};

/// [`put`] into a buffer made for as many bytes (false: another size, nothing written).
fn put_into<T: DeviceRepr + Copy>(
    d: &Device,
    buf: &mut CudaSlice<u8>,
    host: &[T],
    is_zero: impl Fn(&T) -> bool,
) -> Result<bool, CudaError> {
    if !holds(buf, std::mem::size_of_val(host)) {
        return Ok(false);
    }
    if host.iter().all(is_zero) {
        zero(d, buf)?;
    } else {
        d.htod(ptr_of(buf), host)?;
    }
    Ok(true)
}

/// `src` copied into `dst` on the device (stream-ordered), both of one size.
fn copy_buf(d: &Device, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>) -> Result<(), CudaError> {
    crate::exec::launch(
        d,
        &crate::exec::Cmd::Copy {
            dst: ptr_of(dst).ptr,
            src: ptr_of(src).ptr,
            bytes: src.len(),
        },
    )
}

/// A device copy of `src` (a fork), stream-ordered after the work issued so far.
fn dup(d: &Device, src: &CudaSlice<u8>) -> Result<CudaSlice<u8>, CudaError> {
    let dst = d.alloc_raw(src.len())?;
    crate::exec::launch(
        d,
        &crate::exec::Cmd::Copy {
            dst: ptr_of(&dst).ptr,
            src: ptr_of(src).ptr,
            bytes: src.len(),
        },
    )?;
    Ok(dst)
}

impl DevState {
    /// The resident copy of a host layer state.
    pub fn upload(d: &Device, st: &LayerState) -> Result<DevState, CudaError> {
        Ok(match st {
            LayerState::Kv(kv) => DevState::Kv(Box::new(DevKv::upload(d, kv)?)),
            LayerState::Recurrent(r) => DevState::Rec(DevRec::upload(d, r)?),
            LayerState::None => DevState::None,
        })
    }
    /// Copies the device state into the host copy `st` (same kind and shape).
    pub fn download(&self, d: &Device, st: &mut LayerState) -> Result<(), CudaError> {
        match (self, st) {
            (DevState::Kv(k), LayerState::Kv(h)) => k.download(d, h),
            (DevState::Rec(r), LayerState::Recurrent(h)) => r.download(d, h),
            (DevState::None, LayerState::None) => Ok(()),
            _ => Err(mismatch("kind")),
        }
    }
    /// Back to a fresh state of the same geometry, in place (`SeqState::reset`).
    pub fn reset(&mut self, d: &Device) -> Result<(), CudaError> {
        match self {
            DevState::Kv(k) => k.reset(d),
            DevState::Rec(r) => r.reset(d),
            DevState::None => Ok(()),
        }
    }
    /// `LayerState::snapshot(pos)` of the device state, copying only its part.
    pub fn snapshot(&self, d: &Device, pos: usize) -> Result<LayerSnapshot, CudaError> {
        Ok(match self {
            DevState::Kv(k) => LayerSnapshot::Kv(k.snapshot(d, pos)?),
            DevState::Rec(r) => LayerSnapshot::Recurrent(r.snapshot(d)?),
            DevState::None => LayerSnapshot::None,
        })
    }
    /// Whether `self` has `other`'s geometry (kind, shapes and buffer sizes): a copy or an
    /// upload can then go into its buffers in place.
    fn same_shape(&self, other: &DevState) -> bool {
        match (self, other) {
            (DevState::Kv(a), DevState::Kv(b)) => {
                a.stage.is_none() && b.stage.is_none() && a.ncells == b.ncells && a.geo == b.geo && a.mem.iter().zip(&b.mem).all(|(x, y)| x.len() == y.len())
            }
            (DevState::Rec(a), DevState::Rec(b)) => {
                (a.conv_channels, a.n_v_heads, a.head_k_dim, a.head_v_dim, a.conv.len(), a.ssm.len())
                    == (b.conv_channels, b.n_v_heads, b.head_k_dim, b.head_v_dim, b.conv.len(), b.ssm.len())
            }
            (DevState::None, DevState::None) => true,
            _ => false,
        }
    }
    /// Uploads `st` into this state's buffers, kept where they are (a slot's row keeps its
    /// addresses, so a captured step stays valid); false: another geometry, nothing written.
    pub fn upload_into(&mut self, d: &Device, st: &LayerState) -> Result<bool, CudaError> {
        match (self, st) {
            (DevState::Kv(k), LayerState::Kv(kv)) => {
                if k.stage.is_some() || k.ncells != kv.capacity || k.geo != kv_geometry(kv) {
                    return Ok(false);
                }
                let sh = &kv.shadow;
                let z16 = |x: &u16| *x == 0;
                let sizes = if kv.ty == KvType::F32 { [4 * kv.k.len(), 4 * kv.v.len()] } else { [kv.kq.len(), kv.vq.len()] };
                let sh_sizes = [&sh.k_sink, &sh.v_sink, &sh.k_win, &sh.v_win].map(|v| 2 * v.len());
                if !sizes.iter().chain(&sh_sizes).zip(&k.mem).all(|(&b, m)| holds(m, b)) {
                    return Ok(false);
                }
                let [kc, vc, ks, vs, kw, vw] = &mut k.mem;
                if kv.ty == KvType::F32 {
                    let z = |x: &f32| x.to_bits() == 0;
                    put_into(d, kc, &kv.k, z)?;
                    put_into(d, vc, &kv.v, z)?;
                } else {
                    let z = |x: &u8| *x == 0;
                    put_into(d, kc, &kv.kq, z)?;
                    put_into(d, vc, &kv.vq, z)?;
                }
                for (buf, host) in [(ks, &sh.k_sink), (vs, &sh.v_sink), (kw, &sh.k_win), (vw, &sh.v_win)] {
                    put_into(d, buf, host, z16)?;
                }
                Ok(true)
            }
            (DevState::Rec(r), LayerState::Recurrent(h)) => {
                let same = (r.conv_channels, r.n_v_heads, r.head_k_dim, r.head_v_dim) == (h.conv_channels, h.n_v_heads, h.head_k_dim, h.head_v_dim);
                if !same || !holds(&r.conv, 4 * h.conv.len()) || !holds(&r.ssm, 4 * h.ssm.len()) {
                    return Ok(false);
                }
                let z = |x: &f32| x.to_bits() == 0;
                put_into(d, &mut r.conv, &h.conv, z)?;
                put_into(d, &mut r.ssm, &h.ssm, z)?;
                Ok(true)
            }
            (DevState::None, LayerState::None) => Ok(true),
            _ => Ok(false),
        }
    }
    /// Copies this state into `dst`'s buffers on the device, kept where they are (see
    /// [`DevState::upload_into`]); false: another geometry, nothing written.
    pub fn copy_into(&self, d: &Device, dst: &mut DevState) -> Result<bool, CudaError> {
        if !dst.same_shape(self) {
            return Ok(false);
        }
        match (self, dst) {
            (DevState::Kv(a), DevState::Kv(b)) => a.mem.iter().zip(b.mem.iter_mut()).try_for_each(|(s, t)| copy_buf(d, s, t))?,
            (DevState::Rec(a), DevState::Rec(b)) => {
                copy_buf(d, &a.conv, &mut b.conv)?;
                copy_buf(d, &a.ssm, &mut b.ssm)?;
            }
            _ => {}
        }
        Ok(true)
    }
    /// A copy on the device (`SeqState::clone`).
    pub fn fork(&self, d: &Device) -> Result<DevState, CudaError> {
        Ok(match self {
            DevState::Kv(k) => {
                let m = &k.mem;
                DevState::Kv(Box::new(DevKv {
                    geo: k.geo.clone(),
                    mem: [
                        dup(d, &m[0])?,
                        dup(d, &m[1])?,
                        dup(d, &m[2])?,
                        dup(d, &m[3])?,
                        dup(d, &m[4])?,
                        dup(d, &m[5])?,
                    ],
                    ncells: k.ncells,
                    stage: None,
                }))
            }
            DevState::Rec(r) => DevState::Rec(DevRec {
                conv: dup(d, &r.conv)?,
                ssm: dup(d, &r.ssm)?,
                ..*r
            }),
            DevState::None => DevState::None,
        })
    }
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            DevState::Kv(k) => k.mem.iter().map(|m| m.len()).sum(),
            DevState::Rec(r) => r.conv.len() + r.ssm.len(),
            DevState::None => 0,
        }
    }
}
