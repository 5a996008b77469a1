//! Layer states on the device, laid out like the host's `pn_ops::LayerState`:
//! - KV cache: cells `[Hkv][ncells][row bytes]` of k and v in the cache's format (f32
//!   caches as their LE bytes), the f16 sink / window shadows whole; `ncells` is the
//!   capacity for a resident state (the host layout exactly), or the cells a batch can
//!   read for the host protocol's per-call copy (which also has staging rows for the
//!   cells it writes back);
//! - recurrent: the conv window `[d_conv-1][C]` and the ssm state `[Hv][Dv][Dk]`, f32.
//!
//! The geometry and modes the kernels need (ring, rotation, shadow sizes) stay on the
//! host in a data-less copy of the `KvCache` ([`DevKv::geo`]): `runs`, `first_visible`
//! and `check_positions` work on it, and they are all that the host copy's bookkeeping
//! holds (cell contents are addressed by position; the positions come with each batch).

use crate::device::{drv, ptr_of, Device};
use crate::exec::Buf;
use crate::CudaError;
use cudarc::driver::{CudaSlice, DeviceRepr};
use pn_ops::state::{KvSnapshot, Shadows};
use pn_ops::{KvCache, KvType, RecurrentState};

/// Device copy of a KV cache (see the module doc).
pub struct DevKv {
    /// Geometry and modes; no data (empty vectors).
    pub geo: KvCache,
    /// Cells of k, v; shadows k_sink, v_sink, k_win, v_win.
    pub mem: [CudaSlice<u8>; 6],
    pub ncells: usize,
    /// Host protocol: staging rows `[T][Hkv][rb]` of the k / v cells written.
    pub stage: Option<[CudaSlice<u8>; 2]>,
}

/// Device copy of a recurrent state.
pub struct DevRec {
    pub conv: CudaSlice<u8>,
    pub ssm: CudaSlice<u8>,
    pub conv_channels: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
}

pub enum DevState {
    Kv(Box<DevKv>),
    Rec(DevRec),
    None,
}

/// The buffers an attention launch uses.
#[derive(Clone, Copy)]
pub struct KvBufs {
    pub cells: [Buf; 2],
    pub sink: [Buf; 2],
    pub win: [Buf; 2],
    pub ncells: usize,
    pub stage: Option<[Buf; 2]>,
}

/// The buffers a conv / delta-rule launch uses.
#[derive(Clone, Copy)]
pub struct RecBufs {
    pub conv: Buf,
    pub ssm: Buf,
}

/// A KV cache's geometry without its data.
pub fn kv_geometry(kv: &KvCache) -> KvCache {
    let s = &kv.shadow;
    KvCache {
        n_head_kv: kv.n_head_kv,
        head_dim: kv.head_dim,
        capacity: kv.capacity,
        ty: kv.ty,
        k: Vec::new(),
        v: Vec::new(),
        kq: Vec::new(),
        vq: Vec::new(),
        shadow: Shadows {
            sink: s.sink,
            window: s.window,
            slots: s.slots,
            ..Shadows::default()
        },
        ring: kv.ring,
        rot_k: kv.rot_k,
        rot_v: kv.rot_v,
    }
}

/// A device buffer holding `host` (zeroed on the device without a copy when `host` is all
/// zero bits: a fresh state uploads nothing).
fn put<T: DeviceRepr + Copy>(
    d: &Device,
    host: &[T],
    zero: impl Fn(&T) -> bool,
) -> Result<CudaSlice<u8>, CudaError> {
    let buf = d.alloc::<u8>(std::mem::size_of_val(host))?;
    if !host.iter().all(zero) {
        d.htod(ptr_of(&buf), host)?;
    }
    Ok(buf)
}

/// Bytes of the cells of heads `0..Hkv`, cells `0..ncells` of each (f32 caches as LE bytes).
fn cell_bytes(kv: &KvCache, key: bool, ncells: usize) -> Vec<u8> {
    let rb = kv.ty.row_bytes(kv.head_dim);
    let mut out = Vec::with_capacity(kv.n_head_kv * ncells * rb);
    for g in 0..kv.n_head_kv {
        let c = g * kv.capacity;
        if kv.ty == KvType::F32 {
            let src = if key { &kv.k } else { &kv.v };
            let d = kv.head_dim;
            for x in &src[c * d..(c + ncells) * d] {
                out.extend_from_slice(&x.to_le_bytes());
            }
        } else {
            let src = if key { &kv.kq } else { &kv.vq };
            out.extend_from_slice(&src[c * rb..(c + ncells) * rb]);
        }
    }
    out
}

/// Whether a device buffer was made for `bytes` host bytes (empty ones hold 1 byte).
pub(crate) fn holds(buf: &CudaSlice<u8>, bytes: usize) -> bool {
    buf.len() == bytes.max(1)
}

pub(crate) fn mismatch(what: &str) -> CudaError {
    CudaError::Driver(format!(
        "layer state: {what}: the host copy's shape differs from the device copy"
    ))
}

impl DevKv {
    /// The whole cache (resident path).
    pub fn upload(d: &Device, kv: &KvCache) -> Result<DevKv, CudaError> {
        let sh = &kv.shadow;
        let z16 = |x: &u16| *x == 0;
        let (kc, vc) = if kv.ty == KvType::F32 {
            let z = |x: &f32| x.to_bits() == 0;
            (put(d, &kv.k, z)?, put(d, &kv.v, z)?)
        } else {
            let z = |x: &u8| *x == 0;
            (put(d, &kv.kq, z)?, put(d, &kv.vq, z)?)
        };
        Ok(DevKv {
            geo: kv_geometry(kv),
            mem: [
                kc,
                vc,
                put(d, &sh.k_sink, z16)?,
                put(d, &sh.v_sink, z16)?,
                put(d, &sh.k_win, z16)?,
                put(d, &sh.v_win, z16)?,
            ],
            ncells: kv.capacity,
            stage: None,
        })
    }

    /// The host protocol's per-call copy: cells `0..ncells` of every head, the shadows,
    /// staging rows for `t` tokens.
    pub fn host_temp(
        d: &Device,
        kv: &KvCache,
        ncells: usize,
        t: usize,
    ) -> Result<DevKv, CudaError> {
        let sh = &kv.shadow;
        let rb = kv.ty.row_bytes(kv.head_dim);
        let stage = [
            d.alloc::<u8>(t * kv.n_head_kv * rb)?,
            d.alloc::<u8>(t * kv.n_head_kv * rb)?,
        ];
        let z16 = |x: &u16| *x == 0;
        let up = |b: Vec<u8>| d.upload(&b);
        Ok(DevKv {
            geo: kv_geometry(kv),
            mem: [
                up(cell_bytes(kv, true, ncells))?,
                up(cell_bytes(kv, false, ncells))?,
                put(d, &sh.k_sink, z16)?,
                put(d, &sh.v_sink, z16)?,
                put(d, &sh.k_win, z16)?,
                put(d, &sh.v_win, z16)?,
            ],
            ncells,
            stage: Some(stage),
        })
    }

    pub fn bufs(&self) -> KvBufs {
        let p = |i: usize| ptr_of(&self.mem[i]);
        KvBufs {
            cells: [p(0), p(1)],
            sink: [p(2), p(3)],
            win: [p(4), p(5)],
            ncells: self.ncells,
            stage: self.stage.as_ref().map(|[k, v]| [ptr_of(k), ptr_of(v)]),
        }
    }

    /// Host protocol: the cells the batch wrote (staging rows, in token order so a ring's
    /// later write wins, as on the host) and the shadows back into the host cache.
    pub fn write_back(&self, d: &Device, kv: &mut KvCache, pos: &[i32]) -> Result<(), CudaError> {
        let Some([ks, vs]) = &self.stage else {
            return Err(CudaError::Driver("write_back of a resident KV copy".into()));
        };
        let (hkv, rb, dd, t) = (
            kv.n_head_kv,
            kv.ty.row_bytes(kv.head_dim),
            kv.head_dim,
            pos.len(),
        );
        let mut kst = vec![0u8; t * hkv * rb];
        let mut vst = vec![0u8; t * hkv * rb];
        d.dtoh(&mut kst, ptr_of(ks))?;
        d.dtoh(&mut vst, ptr_of(vs))?;
        for (t, &p) in pos.iter().enumerate() {
            let p = p as usize;
            let cell = if kv.ring { p % kv.capacity } else { p };
            for g in 0..hkv {
                let s = (t * hkv + g) * rb;
                let c = g * kv.capacity + cell;
                if kv.ty == KvType::F32 {
                    for (i, b) in kst[s..s + rb].chunks_exact(4).enumerate() {
                        kv.k[c * dd + i] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                    for (i, b) in vst[s..s + rb].chunks_exact(4).enumerate() {
                        kv.v[c * dd + i] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                } else {
                    kv.kq[c * rb..(c + 1) * rb].copy_from_slice(&kst[s..s + rb]);
                    kv.vq[c * rb..(c + 1) * rb].copy_from_slice(&vst[s..s + rb]);
                }
            }
        }
        self.shadows_into(d, kv)
    }

    fn shadows_into(&self, d: &Device, kv: &mut KvCache) -> Result<(), CudaError> {
        let sh = &mut kv.shadow;
        for (i, dst) in [&mut sh.k_sink, &mut sh.v_sink, &mut sh.k_win, &mut sh.v_win]
            .into_iter()
            .enumerate()
        {
            d.dtoh(dst, ptr_of(&self.mem[2 + i]))?;
        }
        Ok(())
    }

    /// Resident path: the whole device copy into a host cache of the same shape.
    pub fn download(&self, d: &Device, kv: &mut KvCache) -> Result<(), CudaError> {
        let same = kv_geometry(kv) == self.geo
            && self.ncells == kv.capacity
            && holds(
                &self.mem[0],
                if kv.ty == KvType::F32 {
                    4 * kv.k.len()
                } else {
                    kv.kq.len()
                },
            )
            && holds(&self.mem[2], 2 * kv.shadow.k_sink.len())
            && holds(&self.mem[4], 2 * kv.shadow.k_win.len());
        if !same {
            return Err(mismatch("KV cache"));
        }
        if kv.ty == KvType::F32 {
            d.dtoh(&mut kv.k, ptr_of(&self.mem[0]))?;
            d.dtoh(&mut kv.v, ptr_of(&self.mem[1]))?;
        } else {
            d.dtoh(&mut kv.kq, ptr_of(&self.mem[0]))?;
            d.dtoh(&mut kv.vq, ptr_of(&self.mem[1]))?;
        }
        self.shadows_into(d, kv)
    }
}

impl DevRec {
    pub fn upload(d: &Device, r: &RecurrentState) -> Result<DevRec, CudaError> {
        let z = |x: &f32| x.to_bits() == 0;
        Ok(DevRec {
            conv: put(d, &r.conv, z)?,
            ssm: put(d, &r.ssm, z)?,
            conv_channels: r.conv_channels,
            n_v_heads: r.n_v_heads,
            head_k_dim: r.head_k_dim,
            head_v_dim: r.head_v_dim,
        })
    }
    /// Host protocol: a per-call copy of the part one op uses, the conv window (`conv`)
    /// or the ssm state (the other part left empty).
    pub fn host_temp(d: &Device, r: &RecurrentState, conv: bool) -> Result<DevRec, CudaError> {
        let z = |x: &f32| x.to_bits() == 0;
        let none: &[f32] = &[];
        Ok(DevRec {
            conv: put(d, if conv { &r.conv } else { none }, z)?,
            ssm: put(d, if conv { none } else { &r.ssm }, z)?,
            conv_channels: r.conv_channels,
            n_v_heads: r.n_v_heads,
            head_k_dim: r.head_k_dim,
            head_v_dim: r.head_v_dim,
        })
    }
    /// Host protocol: the part [`DevRec::host_temp`] uploaded, back into `r`.
    pub fn write_back(
        &self,
        d: &Device,
        r: &mut RecurrentState,
        conv: bool,
    ) -> Result<(), CudaError> {
        if conv {
            d.dtoh(&mut r.conv, ptr_of(&self.conv))
        } else {
            d.dtoh(&mut r.ssm, ptr_of(&self.ssm))
        }
    }
    pub fn download(&self, d: &Device, r: &mut RecurrentState) -> Result<(), CudaError> {
        if !holds(&self.conv, 4 * r.conv.len())
            || !holds(&self.ssm, 4 * r.ssm.len())
            || (
                self.conv_channels,
                self.n_v_heads,
                self.head_k_dim,
                self.head_v_dim,
            ) != (r.conv_channels, r.n_v_heads, r.head_k_dim, r.head_v_dim)
        {
            return Err(mismatch("recurrent state"));
        }
        d.dtoh(&mut r.conv, ptr_of(&self.conv))?;
        d.dtoh(&mut r.ssm, ptr_of(&self.ssm))
    }
    pub fn bufs(&self) -> RecBufs {
        RecBufs { conv: ptr_of(&self.conv), ssm: ptr_of(&self.ssm) }
    }
}

/// Zeroes a device buffer (stream-ordered; its address is kept, so captured graphs that
/// name it stay valid).
pub(crate) fn zero(d: &Device, buf: &mut CudaSlice<u8>) -> Result<(), CudaError> {
    d.stream.memset_zeros(buf).map_err(drv)
}

/// `n` chunks of `chunk` elements from `src`, chunk `i` at byte `i * stride`, into `dst`
/// back to back: asynchronous copies, then one synchronize (the data is in `dst` on return).
fn dtoh_strided<T: DeviceRepr>(
    d: &Device,
    dst: &mut [T],
    src: Buf,
    chunk: usize,
    stride: usize,
    n: usize,
) -> Result<(), CudaError> {
    let cb = chunk * std::mem::size_of::<T>();
    if cb == 0 || n == 0 {
        return Ok(());
    }
    if dst.len() != n * chunk || (n - 1) * stride + cb > src.bytes {
        return Err(CudaError::Driver(format!(
            "strided download of {n} x {cb} bytes (stride {stride}) from {} bytes",
            src.bytes
        )));
    }
    for (i, out) in dst.chunks_exact_mut(chunk).enumerate() {
        // SAFETY: `src` is a live allocation holding chunk `i` (checked above); `dst`
        // stays borrowed until the synchronize below has returned.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                out,
                src.ptr + (i * stride) as u64,
                d.stream.cu_stream(),
            )
        }
        .map_err(drv)?;
    }
    d.stream.synchronize().map_err(drv)
}

impl DevKv {
    /// Back to a fresh cache of the same geometry: every cell and shadow zero.
    pub fn reset(&mut self, d: &Device) -> Result<(), CudaError> {
        if self.stage.is_some() {
            return Err(CudaError::Driver("reset of a host-protocol KV copy".into()));
        }
        self.mem.iter_mut().try_for_each(|m| zero(d, m))
    }

    /// [`KvCache::snapshot`]`(pos)` of the device copy, moving only what it holds: the
    /// used cells `min(pos, capacity)` of every head and the sink / window shadows of the
    /// positions a later query can read.
    pub fn snapshot(&self, d: &Device, pos: usize) -> Result<KvSnapshot, CudaError> {
        let g = &self.geo;
        if self.stage.is_some() || self.ncells != g.capacity {
            return Err(CudaError::Driver(
                "snapshot of a host-protocol KV copy".into(),
            ));
        }
        let (hkv, dd, cap) = (g.n_head_kv, g.head_dim, g.capacity);
        let rb = g.ty.row_bytes(dd);
        let used = pos.min(cap);
        let sh = &g.shadow;
        let (n_sink, n_win) = (pos.min(sh.sink), pos.min(sh.window));
        let mut s = KvSnapshot {
            ty: g.ty,
            pos,
            used,
            sink: sh.sink,
            window: sh.window,
            ..Default::default()
        };
        let b = |i: usize| ptr_of(&self.mem[i]);
        if g.ty == KvType::F32 {
            s.k = vec![0.0; hkv * used * dd];
            s.v = vec![0.0; hkv * used * dd];
            dtoh_strided(d, &mut s.k, b(0), used * dd, cap * rb, hkv)?;
            dtoh_strided(d, &mut s.v, b(1), used * dd, cap * rb, hkv)?;
        } else {
            s.kq = vec![0; hkv * used * rb];
            s.vq = vec![0; hkv * used * rb];
            dtoh_strided(d, &mut s.kq, b(0), used * rb, cap * rb, hkv)?;
            dtoh_strided(d, &mut s.vq, b(1), used * rb, cap * rb, hkv)?;
        }
        // shadows: per head the sink rows `< n_sink`, then the window rows of positions
        // `pos - n_win .. pos` (a ring of `slots` rows: at most two runs per head)
        let per_head = (n_sink + n_win) * dd;
        let mut ks = vec![0u16; hkv * per_head];
        let mut vs = vec![0u16; hkv * per_head];
        if n_sink > 0 {
            let mut a = vec![0u16; hkv * n_sink * dd];
            for (i, dst) in [&mut ks, &mut vs].into_iter().enumerate() {
                dtoh_strided(d, &mut a, b(2 + i), n_sink * dd, 2 * sh.sink * dd, hkv)?;
                for h in 0..hkv {
                    dst[h * per_head..h * per_head + n_sink * dd]
                        .copy_from_slice(&a[h * n_sink * dd..(h + 1) * n_sink * dd]);
                }
            }
        }
        if n_win > 0 {
            // the whole window ring (`slots` rows per head: small, bounded by the window)
            let mut a = vec![0u16; hkv * sh.slots * dd];
            for (i, dst) in [&mut ks, &mut vs].into_iter().enumerate() {
                d.dtoh(&mut a, b(4 + i))?;
                for h in 0..hkv {
                    for (r, j) in (pos - n_win..pos).enumerate() {
                        let o = (h * sh.slots + j % sh.slots) * dd;
                        let t = h * per_head + (n_sink + r) * dd;
                        dst[t..t + dd].copy_from_slice(&a[o..o + dd]);
                    }
                }
            }
        }
        s.k_sh = ks;
        s.v_sh = vs;
        Ok(s)
    }
}

impl DevRec {
    /// Back to a fresh state: conv window and ssm state zero.
    pub fn reset(&mut self, d: &Device) -> Result<(), CudaError> {
        zero(d, &mut self.conv)?;
        zero(d, &mut self.ssm)
    }

    /// The whole state as a host `RecurrentState` (its snapshot).
    pub fn snapshot(&self, d: &Device) -> Result<RecurrentState, CudaError> {
        let mut r = RecurrentState {
            conv: vec![0.0; self.conv.len() / 4],
            conv_channels: self.conv_channels,
            ssm: vec![0.0; self.ssm.len() / 4],
            n_v_heads: self.n_v_heads,
            head_k_dim: self.head_k_dim,
            head_v_dim: self.head_v_dim,
        };
        d.dtoh(&mut r.conv, ptr_of(&self.conv))?;
        d.dtoh(&mut r.ssm, ptr_of(&self.ssm))?;
        Ok(r)
    }
}
