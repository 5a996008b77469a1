//! The device: context, stream, loaded kernels, buffers, and the weight cache.

use crate::exec::{Buf, K};
use crate::formats::{self, Residency};
use crate::kernels::{self, MODULES};
use crate::weights::{sample, CacheStats, WeightCache, WeightKey};
use crate::CudaError;
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchArgs,
    LaunchConfig, ValidAsZeroBits,
};
use pn_ops::{GgmlType, WeightView};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A weight resident on the device: raw GGUF blocks (or the f16 fallback).
pub struct DevWeight {
    pub buf: CudaSlice<u8>,
    /// `buf`'s address range (weights stay cached, so it stays valid).
    pub ptr: Buf,
    /// The format of `buf` (the GGUF type, or F16 for dequantized-on-upload types).
    pub ty: GgmlType,
    pub row_bytes: usize,
}

pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: String,
    pub name: String,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Static shared memory of each kernel (bytes, from the driver): a launch's dynamic
    /// shared memory plus this must fit in [`SHARED_PER_BLOCK`].
    static_shared: HashMap<&'static str, usize>,
    /// Keyed by host bytes, type, shape and form, checked against a sample of the bytes
    /// (weights.rs): a reused host address never gets a stale device weight.
    weights: Mutex<WeightCache<Arc<DevWeight>>>,
}

/// Shared memory a block may use without opting in (static + dynamic), every arch ≥ sm_70.
pub const SHARED_PER_BLOCK: usize = 48 * 1024;

/// The most dynamic shared memory a kernel with `static_bytes` of static shared memory
/// can be launched with (without the opt-in attribute).
pub fn dynamic_shared_max(static_bytes: usize) -> usize {
    SHARED_PER_BLOCK.saturating_sub(static_bytes)
}

/// Whether kernel `name` with `static_bytes` of static shared memory can be launched with
/// `dynamic` bytes of dynamic shared memory (a clear error instead of a launch failure).
pub fn shared_fits(name: &str, dynamic: usize, static_bytes: usize) -> Result<(), CudaError> {
    if dynamic <= dynamic_shared_max(static_bytes) {
        return Ok(());
    }
    Err(CudaError::Unsupported(format!(
        "{name}: {dynamic} bytes of dynamic shared memory + {static_bytes} static > {SHARED_PER_BLOCK} per block"
    )))
}

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names; no symbol is called.
    std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false)
}

impl Device {
    /// Physical device `index` (its primary context: several `Device`s of one index share
    /// it, each with its own stream).
    pub fn new(index: usize) -> Result<Device, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDevice(
                "libcuda could not be loaded (no NVIDIA driver on this machine)".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| CudaError::NoDevice(format!("cuInit / cuDeviceGetCount failed: {e:?}")))?;
        if index >= count.max(0) as usize {
            return Err(CudaError::NoDevice(format!(
                "device {index} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(index)
            .map_err(|e| CudaError::NoDevice(format!("device {index}: {e:?}")))?;
        let (major, minor) = ctx.compute_capability().map_err(drv)?;
        let arch = format!("sm_{major}{minor}");
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        // One owned (non-blocking) stream for everything: the legacy default stream
        // cannot be captured into a graph (stream.rs). With one stream nothing needs
        // cudarc's per-buffer event tracking, which would also record events inside a
        // capture; it is turned off before any buffer exists.
        // SAFETY: no CudaSlice of this context exists yet, and all work goes to `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let mut funcs = HashMap::new();
        let mut static_shared = HashMap::new();
        for m in MODULES {
            let cubin = kernels::cubin(m, &arch)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                .map_err(|e| CudaError::Driver(format!("loading {} for {arch}: {e:?}", m.file)))?;
            for &e in m.entries {
                let f = module
                    .load_function(e)
                    .map_err(|err| CudaError::Driver(format!("{}: kernel {e}: {err:?}", m.file)))?;
                let sh = f.shared_size_bytes().map_err(|err| {
                    CudaError::Driver(format!("{}: kernel {e}: shared size: {err:?}", m.file))
                })?;
                static_shared.insert(e, sh.max(0) as usize);
                funcs.insert(e, f);
            }
        }
        Ok(Device {
            ctx,
            stream,
            arch,
            name,
            funcs,
            static_shared,
            weights: Mutex::new(WeightCache::default()),
        })
    }

    /// Static shared memory of kernel `name` (bytes; 0 for an unknown name).
    pub fn static_shared(&self, name: &str) -> usize {
        self.static_shared.get(name).copied().unwrap_or(0)
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError::Driver(format!("kernel {name} not loaded")))
    }

    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        data: &[T],
    ) -> Result<CudaSlice<T>, CudaError> {
        if data.is_empty() {
            return self.alloc::<T>(0);
        }
        self.stream.clone_htod(data).map_err(drv)
    }

    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(drv)
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>, CudaError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut out = vec![T::default(); n];
        self.stream
            .memcpy_dtoh(&buf.slice(0..n), &mut out[..])
            .map_err(drv)?;
        Ok(out)
    }

    /// A launch builder for kernel `name` (cudarc's typed builder: graph selftest).
    pub fn launch(&self, name: &str) -> Result<LaunchArgs<'_>, CudaError> {
        Ok(self.stream.launch_builder(self.func(name)?))
    }

    /// A launch descriptor for kernel `name` (exec.rs).
    pub fn k(&self, name: &str) -> Result<K, CudaError> {
        let (&n, f) = self
            .funcs
            .get_key_value(name)
            .ok_or_else(|| CudaError::Driver(format!("kernel {name} not loaded")))?;
        Ok(K::new(n, f.cu_function() as usize))
    }

    /// `n` bytes, uninitialized (scratch chunks: every piece is written before it is read).
    pub fn alloc_raw(&self, n: usize) -> Result<CudaSlice<u8>, CudaError> {
        // SAFETY: u8 has no invalid bit patterns; the contents are written by kernels
        // before being read (exec.rs Scratch).
        unsafe { self.stream.alloc::<u8>(n.max(1)) }.map_err(drv)
    }

    /// Host → device into an existing buffer (stream-ordered; from pageable memory the
    /// driver may wait for the stream: only off the per-step path).
    pub fn htod<T: DeviceRepr>(&self, dst: Buf, src: &[T]) -> Result<(), CudaError> {
        let n = std::mem::size_of_val(src);
        if n == 0 {
            return Ok(());
        }
        if n > dst.bytes {
            return Err(CudaError::Driver(format!(
                "upload of {n} bytes into {} bytes",
                dst.bytes
            )));
        }
        // SAFETY: `dst` is a live allocation of at least `n` bytes (checked above).
        unsafe { result::memcpy_htod_async(dst.ptr, src, self.stream.cu_stream()) }.map_err(drv)
    }

    /// Device → host, then the stream is synchronized (the data is in `dst` on return).
    pub fn dtoh<T: DeviceRepr>(&self, dst: &mut [T], src: Buf) -> Result<(), CudaError> {
        let n = std::mem::size_of_val(dst);
        if n == 0 {
            return Ok(());
        }
        if n > src.bytes {
            return Err(CudaError::Driver(format!(
                "download of {n} bytes from {} bytes",
                src.bytes
            )));
        }
        // SAFETY: `src` is a live allocation of at least `n` bytes (checked above); `dst`
        // stays borrowed until the synchronize below has returned.
        unsafe { result::memcpy_dtoh_async(dst, src.ptr, self.stream.cu_stream()) }.map_err(drv)?;
        self.stream.synchronize().map_err(drv)
    }

    /// A weight for matmul / get_rows, uploaded once: raw blocks when the format has
    /// native kernels, else dequantized on the host to f16 (documented fallback).
    pub fn weight(&self, w: &WeightView<'_>) -> Result<Arc<DevWeight>, CudaError> {
        let (key, smp) = (WeightKey::of(w, false), sample(w.bytes));
        if let Some(d) = self.weights.lock().map_err(poison)?.get(&key, smp) {
            return Ok(d);
        }
        let dw = match formats::residency(w.ty) {
            Residency::Native => {
                let rb = w.row_bytes();
                let n = rb * w.shape.rows();
                DevWeight::new(self.upload(&w.bytes[..n])?, w.ty, rb)
            }
            Residency::F16Fallback => {
                let f = w
                    .try_to_f32()
                    .map_err(|e| CudaError::Unsupported(format!("{}: {e}", w.name)))?;
                let bytes: Vec<u8> = f
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
                    .collect();
                DevWeight::new(self.upload(&bytes)?, GgmlType::F16, 2 * w.shape.0[0])
            }
            Residency::No(why) => return Err(CudaError::Unsupported(format!("{}: {why}", w.name))),
        };
        let dw = Arc::new(dw);
        self.weights
            .lock()
            .map_err(poison)?
            .insert(key, smp, dw.clone());
        Ok(dw)
    }

    /// A small weight (norm / conv / broadcast operand) as f32 on the device, uploaded once.
    pub fn weight_f32(&self, w: &WeightView<'_>) -> Result<Arc<DevWeight>, CudaError> {
        let (key, smp) = (WeightKey::of(w, true), sample(w.bytes));
        if let Some(d) = self.weights.lock().map_err(poison)?.get(&key, smp) {
            return Ok(d);
        }
        let f = w
            .try_to_f32()
            .map_err(|e| CudaError::Unsupported(format!("{}: {e}", w.name)))?;
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dw = Arc::new(DevWeight::new(
            self.upload(&bytes)?,
            GgmlType::F32,
            4 * w.shape.0[0],
        ));
        self.weights
            .lock()
            .map_err(poison)?
            .insert(key, smp, dw.clone());
        Ok(dw)
    }

    /// Bytes held by cached weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights
            .lock()
            .map(|m| m.values().map(|w| w.buf.len()).sum())
            .unwrap_or(0)
    }

    /// Hits, misses and stale entries of the weight cache.
    pub fn weight_stats(&self) -> CacheStats {
        self.weights.lock().map(|m| m.stats()).unwrap_or_default()
    }
}

impl DevWeight {
    fn new(buf: CudaSlice<u8>, ty: GgmlType, row_bytes: usize) -> DevWeight {
        let ptr = ptr_of(&buf);
        DevWeight {
            buf,
            ptr,
            ty,
            row_bytes,
        }
    }
}

/// The address range of a device buffer.
pub fn ptr_of<T>(s: &CudaSlice<T>) -> Buf {
    // Event tracking is off (Device::new), so the guard cudarc returns does nothing.
    let (ptr, _guard) = s.device_ptr(s.stream());
    Buf {
        ptr,
        bytes: s.num_bytes(),
    }
}

pub fn drv(e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

fn poison<T>(_: T) -> CudaError {
    CudaError::Driver("weight cache lock poisoned".into())
}

/// 1-D launch over `n` items with `threads` per block.
pub fn grid1(n: usize, threads: u32) -> LaunchConfig {
    let blocks = n.div_ceil(threads as usize).max(1) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launch a built kernel call.
pub fn go(mut b: LaunchArgs<'_>, cfg: LaunchConfig) -> Result<(), CudaError> {
    // SAFETY: every launch site passes the arguments in the order and with the types
    // of the kernel's C signature (pointers as device slices, ints as i32/i64, floats
    // as f32), sizes its grid to the buffers it allocated, and the kernels bound-check
    // their indices against the sizes passed.
    unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// attn_kv keeps a head row of D floats in dynamic shared memory beside 384 static
    /// bytes (kernels/attention.cu: float shf[32], double shd[32]).
    #[test]
    fn static_shared_memory_counts_against_the_dynamic_limit() {
        let stat = 32 * 4 + 32 * 8;
        assert!(
            shared_fits("attn_kv", 12192 * 4, stat).is_ok(),
            "48 KiB - 384 fits"
        );
        let e = shared_fits("attn_kv", 12288 * 4, stat)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("attn_kv") && e.contains("49152 bytes") && e.contains("384 static"),
            "{e}"
        );
        assert!(
            shared_fits("kv_store", 12288 * 4, 0).is_ok(),
            "no static: all 48 KiB"
        );
        assert_eq!(dynamic_shared_max(SHARED_PER_BLOCK + 1), 0);
    }
}
