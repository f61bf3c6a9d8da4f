//! A Burn module's float parameters as ferroccl sees them: listed in the
//! order the module visits them (its declaration order, the same on every
//! rank of one program), read to host memory and written back. This module
//! owns the moves between Burn tensors and host slices; it starts no
//! collective of its own except the weight broadcast.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use ferroccl::{Communicator, Error, Result};

/// One float parameter: its id, a dotted name for error messages
/// (`conv1.weight`), its shape and its element count.
#[derive(Debug, Clone)]
pub(crate) struct ParamInfo {
    pub(crate) id: ParamId,
    pub(crate) name: String,
    pub(crate) len: usize,
}

/// Every float parameter of `module`, in visiting order.
pub(crate) fn list<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamInfo> {
    let mut lister = Lister {
        path: Vec::new(),
        out: Vec::new(),
    };
    module.visit(&mut lister);
    lister.out
}

struct Lister {
    path: Vec<String>,
    out: Vec<ParamInfo>,
}

impl Lister {
    fn name(&self) -> String {
        if self.path.is_empty() {
            format!("param{}", self.out.len())
        } else {
            self.path.join(".")
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for Lister {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.lazy_shape();
        self.out.push(ParamInfo {
            id: param.id,
            name: self.name(),
            len: shape.num_elements(),
        });
    }
}

/// Copy rank 0's parameters into every rank's `module` (as PyTorch's DDP
/// does at construction), bit for bit in each parameter's own type: the
/// bytes of all float parameters travel as one broadcast. A collective:
/// every rank calls it with the same architecture.
pub fn broadcast_module<B: Backend, M: Module<B>>(comm: &Communicator, module: M) -> Result<M> {
    let mut reader = ByteReader {
        bytes: Vec::new(),
        shapes: Vec::new(),
    };
    module.visit(&mut reader);
    // The layout (count, shapes and types) is checked first, so that two
    // different models give an error instead of a broadcast of the wrong
    // length.
    check_same_layout(comm, &reader.shapes)?;
    comm.broadcast(&mut reader.bytes, 0)?;
    let mut writer = ByteWriter {
        bytes: &reader.bytes,
        at: 0,
    };
    Ok(module.map(&mut writer))
}

/// Every rank must hold the same parameters: a fingerprint of the shapes
/// and types is gathered and compared, naming the first rank that differs.
fn check_same_layout(comm: &Communicator, shapes: &[(Vec<usize>, DType)]) -> Result<()> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    };
    eat(shapes.len() as u64);
    for (shape, dtype) in shapes {
        eat(shape.len() as u64);
        for &d in shape {
            eat(d as u64);
        }
        eat(dtype.size() as u64);
    }
    let mut all = vec![0u64; comm.size()];
    comm.all_gather(&[h], &mut all)?;
    if let Some(r) = all.iter().position(|&x| x != all[0]) {
        return Err(Error::InvalidArgument(format!(
            "ferroccl-burn: rank {r} holds a model whose parameters (count, shapes or types) \
             differ from rank 0's ({} float parameters here, on rank {})",
            shapes.len(),
            comm.rank()
        )));
    }
    Ok(())
}

struct ByteReader {
    bytes: Vec<u8>,
    shapes: Vec<(Vec<usize>, DType)>,
}

impl<B: Backend> ModuleVisitor<B> for ByteReader {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data();
        self.shapes.push((data.shape.clone(), data.dtype));
        self.bytes.extend_from_slice(&data.bytes);
    }
}

struct ByteWriter<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<B: Backend> ModuleMapper<B> for ByteWriter<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let device = tensor.device();
        let dtype = tensor.dtype();
        let shape = tensor.shape().dims;
        let n = shape.iter().product::<usize>() * dtype.size();
        // The reader filled `bytes` from the same module in the same order,
        // and the broadcast kept its length, so the slice exists.
        let data =
            TensorData::from_bytes_vec(self.bytes[self.at..self.at + n].to_vec(), shape, dtype);
        self.at += n;
        let mut value = Tensor::from_data(data, &device);
        if require_grad {
            value = value.require_grad();
        }
        Param::from_mapped_value(id, value, mapper)
    }
}

/// A tensor's elements as f32 on the host: the reducer's element type.
/// Backends whose float is f32 on the CPU hand their buffer over without
/// a conversion; others (f64, f16, device backends) are converted or
/// staged through host memory here.
pub(crate) fn to_host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> (Vec<f32>, DType) {
    let data = t.into_data();
    let dtype = data.dtype;
    let values = match data.as_slice::<f32>() {
        Ok(s) => s.to_vec(),
        Err(_) => data.convert::<f32>().to_vec::<f32>().unwrap_or_default(),
    };
    (values, dtype)
}

/// A tensor of `shape` and `dtype` on `device` holding `values`.
pub(crate) fn from_host_f32<B: Backend, const D: usize>(
    values: &[f32],
    shape: Vec<usize>,
    dtype: DType,
    device: &B::Device,
) -> Tensor<B, D> {
    let data = TensorData::new(values.to_vec(), shape).convert_dtype(dtype);
    Tensor::from_data(data, device)
}
