//! Activations ([`Tensor`]) and zero-copy weight views ([`WeightView`]).
//!
//! Shapes are in ggml order: `ne[0]` is the innermost, contiguous dimension. An
//! activation `[n_embd, T]` holds T tokens of n_embd floats each (token-major memory).

use crate::GgmlType;
use std::fmt;

/// ggml-order shape `[ne0, ne1, ne2, ne3]`; unused trailing dims are 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape(pub [usize; 4]);

impl Shape {
    pub fn d1(a: usize) -> Shape {
        Shape([a, 1, 1, 1])
    }
    pub fn d2(a: usize, b: usize) -> Shape {
        Shape([a, b, 1, 1])
    }
    pub fn d3(a: usize, b: usize, c: usize) -> Shape {
        Shape([a, b, c, 1])
    }
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// Number of dims up to the last one that is not 1 (at least 1).
    pub fn rank(&self) -> usize {
        (1..=4).rev().find(|&i| self.0[i - 1] != 1).unwrap_or(1)
    }
    pub fn ne(&self, i: usize) -> usize {
        self.0[i]
    }
    /// Number of rows of `ne0` elements.
    pub fn rows(&self) -> usize {
        self.0[1] * self.0[2] * self.0[3]
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.rank();
        write!(f, "[")?;
        for i in 0..r {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{}", self.0[i])?;
        }
        write!(f, "]")
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Element type of an activation. Weights carry their own [`GgmlType`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I32,
    /// A GGUF weight of the given block format (only ever a graph leaf).
    Weight(GgmlType),
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::I32 => f.write_str("i32"),
            DType::Weight(t) => write!(f, "{}", t.name().to_ascii_lowercase()),
        }
    }
}

/// Shape and element type of a node's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    pub shape: Shape,
    pub dtype: DType,
}

impl TensorMeta {
    pub fn f32(shape: Shape) -> TensorMeta {
        TensorMeta { shape, dtype: DType::F32 }
    }
    pub fn i32(shape: Shape) -> TensorMeta {
        TensorMeta { shape, dtype: DType::I32 }
    }
}

impl fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A dense activation tensor (contiguous, ggml order).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Shape,
    pub data: TensorData,
}

impl Tensor {
    pub fn f32(shape: Shape, data: Vec<f32>) -> Tensor {
        assert_eq!(shape.numel(), data.len(), "tensor data length must match its shape");
        Tensor { shape, data: TensorData::F32(data) }
    }
    pub fn i32(shape: Shape, data: Vec<i32>) -> Tensor {
        assert_eq!(shape.numel(), data.len(), "tensor data length must match its shape");
        Tensor { shape, data: TensorData::I32(data) }
    }
    pub fn zeros(shape: Shape) -> Tensor {
        Tensor::f32(shape, vec![0.0; shape.numel()])
    }
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
        }
    }
    pub fn meta(&self) -> TensorMeta {
        TensorMeta { shape: self.shape, dtype: self.dtype() }
    }
    /// The f32 data; panics only on a graph-construction bug (shape inference checked dtypes).
    pub fn as_f32(&self) -> &[f32] {
        match &self.data {
            TensorData::F32(v) => v,
            TensorData::I32(_) => panic!("expected an f32 tensor, found i32"),
        }
    }
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            TensorData::F32(v) => v,
            TensorData::I32(_) => panic!("expected an f32 tensor, found i32"),
        }
    }
    pub fn as_i32(&self) -> &[i32] {
        match &self.data {
            TensorData::I32(v) => v,
            TensorData::F32(_) => panic!("expected an i32 tensor, found f32"),
        }
    }
    pub fn into_f32(self) -> Vec<f32> {
        match self.data {
            TensorData::F32(v) => v,
            TensorData::I32(_) => panic!("expected an f32 tensor, found i32"),
        }
    }
}

/// A weight tensor as stored in the GGUF: raw blocks, zero-copy from the file mapping.
///
/// `shape` is ggml order: a matrix `[K, N]` is N rows of K elements; a 3-D expert tensor
/// `[K, N, E]` holds E such matrices back to back (expert `e` starts at `e * expert_bytes()`).
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub shape: Shape,
    pub bytes: &'a [u8],
    /// The same rows in the `rows16` layout (`quant::rows16`), when the loader made that
    /// copy for the CPU's matmuls; `bytes` stays the plain rows (every other reader). It
    /// may hold only the first rows (a matrix's whole 16-row groups: the last `rows % 16`
    /// are read from `bytes`).
    pub rows16: Option<&'a [u8]>,
}

impl<'a> WeightView<'a> {
    /// Bytes of one row of `ne0` elements. Shape validity (multiple of the block size) is
    /// checked when the GGUF is opened.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.shape.0[0]).expect("row length checked at load")
    }
    /// Row `r` (over all rows of all matrices) as raw blocks.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.bytes[r * rb..(r + 1) * rb]
    }
    /// Bytes of one `[ne0, ne1]` matrix (one expert of a 3-D tensor).
    pub fn matrix_bytes(&self) -> usize {
        self.row_bytes() * self.shape.0[1]
    }
    /// The 2-D slice `e` of a 3-D tensor, without copying.
    pub fn expert(&self, e: usize) -> WeightView<'a> {
        let mb = self.matrix_bytes();
        WeightView {
            name: self.name,
            ty: self.ty,
            shape: Shape::d2(self.shape.0[0], self.shape.0[1]),
            bytes: &self.bytes[e * mb..(e + 1) * mb],
            rows16: self.rows16.and_then(|p| p.get(e * mb..(e + 1) * mb)),
        }
    }
    /// The whole tensor dequantized to f32 (for small tensors: norms, biases, conv taps).
    pub fn try_to_f32(&self) -> Result<Vec<f32>, crate::quant::QuantError> {
        let mut out = vec![0.0f32; self.shape.numel()];
        let ne0 = self.shape.0[0];
        for (r, chunk) in out.chunks_mut(ne0).enumerate() {
            crate::quant::dequantize_row(self.ty, self.row(r), chunk)?;
        }
        Ok(out)
    }
    /// [`WeightView::try_to_f32`] for weights whose type was checked when the model was
    /// loaded (`GgmlType::is_supported_weight`).
    pub fn to_f32(&self) -> Vec<f32> {
        self.try_to_f32().expect("weight types are checked at load time")
    }
}

/// An input of a node at run time: an activation or a weight view.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Act(&'a Tensor),
    Weight(WeightView<'a>),
}

impl<'a> Value<'a> {
    pub fn act(&self) -> &'a Tensor {
        match self {
            Value::Act(t) => t,
            Value::Weight(w) => panic!("expected an activation, found weight {}", w.name),
        }
    }
    pub fn weight(&self) -> WeightView<'a> {
        match self {
            Value::Weight(w) => *w,
            Value::Act(_) => panic!("expected a weight, found an activation"),
        }
    }
}
