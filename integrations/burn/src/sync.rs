//! Gradient synchronisation for a custom training loop: Burn's
//! `GradientsParams` after `backward()` go through the library's DDP
//! [`Reducer`] (buckets, averaging, optional fp16/bf16 compression) and
//! come back averaged over the ranks, ready for the optimizer. This module
//! owns the mapping between Burn parameter ids and reducer indices; the
//! bucketing and the collectives are the reducer's.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};
use ferroccl::ddp::{AllReduceHook, CommHook, ParamSpec, Reducer, ReducerConfig};
use ferroccl::{Communicator, Error, Result};

use crate::params::{self, ParamInfo};

/// Averages a Burn model's gradients over every rank of a communicator.
///
/// Built once per model (a collective: every rank passes the same
/// architecture and settings); then once per optimizer step,
/// [`sync`](Self::sync) replaces each gradient in a `GradientsParams` by
/// its average over the ranks. Micro-steps that should only accumulate
/// (gradient accumulation, PyTorch's `no_sync`) go through
/// [`accumulate`](Self::accumulate) instead; the next `sync` averages their
/// sum with its own gradients.
///
/// ```no_run
/// # use burn::backend::{Autodiff, NdArray};
/// # use burn::module::Module;
/// # use burn::nn::{Linear, LinearConfig};
/// # use burn::optim::{GradientsParams, Optimizer, SgdConfig};
/// # use burn::tensor::Tensor;
/// # type B = Autodiff<NdArray>;
/// let comm = ferroccl::Communicator::from_env()?;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(4, 2).init(&device);
/// let model = ferroccl_burn::broadcast_module(&comm, model)?;
/// let mut sync = ferroccl_burn::GradientSync::new(&comm, &model, Default::default())?;
/// let mut optim = SgdConfig::new().init();
/// # let x = Tensor::<B, 2>::zeros([8, 4], &device);
/// let loss = model.forward(x).sum(); // on this rank's share of the batch
/// let grads = GradientsParams::from_grads(loss.backward(), &model);
/// let grads = sync.sync(&model, grads)?; // averaged over the ranks
/// let model = optim.step(0.1, model, grads);
/// # Ok::<(), ferroccl::Error>(())
/// ```
pub struct GradientSync<'c> {
    reducer: Reducer<'c, f32>,
    params: Vec<ParamInfo>,
    index: HashMap<ParamId, usize>,
}

impl std::fmt::Debug for GradientSync<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradientSync")
            .field("params", &self.params.len())
            .field("reducer", &self.reducer)
            .finish()
    }
}

impl<'c> GradientSync<'c> {
    /// Averages with the default hook (one allreduce per bucket).
    pub fn new<B: AutodiffBackend, M: AutodiffModule<B>>(
        comm: &'c Communicator,
        model: &M,
        config: ReducerConfig,
    ) -> Result<Self> {
        Self::with_hook(comm, model, config, AllReduceHook)
    }

    /// Averages through `hook`, e.g. [`ferroccl::ddp::Fp16CompressHook`]
    /// or [`ferroccl::ddp::Bf16CompressHook`] to move half the bytes.
    pub fn with_hook<B: AutodiffBackend, M: AutodiffModule<B>>(
        comm: &'c Communicator,
        model: &M,
        config: ReducerConfig,
        hook: impl CommHook<f32> + 'c,
    ) -> Result<Self> {
        let params = params::list::<B, M>(model);
        let specs: Vec<ParamSpec> = params
            .iter()
            .map(|p| ParamSpec::new(p.name.clone(), p.len))
            .collect();
        let reducer = Reducer::with_hook(comm, &specs, config, hook)?;
        let index = params.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        Ok(GradientSync {
            reducer,
            params,
            index,
        })
    }

    /// The reducer underneath (bucket layout, steps, unused parameters).
    pub fn reducer(&self) -> &Reducer<'c, f32> {
        &self.reducer
    }

    /// Average `grads` (this rank's gradients of `model`) over every rank
    /// and return them, each parameter's gradient replaced by the average,
    /// plus whatever earlier [`accumulate`](Self::accumulate) calls handed
    /// over since the last sync. A parameter without a gradient on this
    /// rank counts as zero; one that no rank gave a gradient stays absent,
    /// so the optimizer skips it as it would in one process.
    ///
    /// A collective: every rank calls it for the same step. A failed peer
    /// gives [`Error::PeerFailed`] naming it, on every other rank.
    pub fn sync<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams> {
        self.reducer.set_sync(true);
        let (mut grads, meta) = self.hand_over::<B, M>(model, grads)?;
        self.reducer.finish()?;
        let unused = self.reducer.globally_unused().to_vec();
        let mut writer = Writer::<B> {
            reducer: &self.reducer,
            index: &self.index,
            meta: &meta,
            unused: &unused,
            grads: &mut grads,
            _b: std::marker::PhantomData,
        };
        model.visit(&mut writer);
        Ok(grads)
    }

    /// Hand over a micro-step's gradients without communicating: they are
    /// summed locally and averaged with the next [`sync`](Self::sync). Every
    /// rank must accumulate the same number of micro-steps.
    pub fn accumulate<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        grads: GradientsParams,
    ) -> Result<()> {
        self.reducer.set_sync(false);
        let result = self
            .hand_over::<B, M>(model, grads)
            .and_then(|_| self.reducer.finish());
        self.reducer.set_sync(true);
        result
    }

    /// Reads every gradient of `model` out of `grads` (removing it) and
    /// marks it ready in the reducer, last parameter first as backward
    /// produced them, so the first buckets start reducing while later
    /// ones are still being copied.
    fn hand_over<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        model: &M,
        mut grads: GradientsParams,
    ) -> Result<(GradientsParams, Vec<Meta>)> {
        let mut reader = Reader::<B> {
            grads: &mut grads,
            index: &self.index,
            host: vec![None; self.params.len()],
            meta: vec![None; self.params.len()],
            unknown: None,
            _b: std::marker::PhantomData,
        };
        model.visit(&mut reader);
        if let Some(id) = reader.unknown {
            return Err(Error::InvalidArgument(format!(
                "ferroccl-burn: parameter {id} is not in the model this GradientSync was built for"
            )));
        }
        let (host, meta) = (reader.host, reader.meta);
        let meta: Vec<Meta> = meta
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                m.ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "ferroccl-burn: parameter {i} ({}) of the GradientSync is missing from \
                         the model passed in",
                        self.params[i].name
                    ))
                })
            })
            .collect::<Result<_>>()?;
        for (i, g) in host.iter().enumerate().rev() {
            match g {
                Some(values) => self.reducer.mark_ready(i, values)?,
                None => self.reducer.mark_unused(i)?,
            }
        }
        Ok((grads, meta))
    }
}

/// What a gradient looked like before it went to the host, to rebuild it.
#[derive(Clone)]
struct Meta {
    shape: Vec<usize>,
    dtype: DType,
}

struct Reader<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    index: &'a HashMap<ParamId, usize>,
    host: Vec<Option<Vec<f32>>>,
    meta: Vec<Option<Meta>>,
    unknown: Option<ParamId>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Reader<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&i) = self.index.get(&param.id) else {
            self.unknown = Some(param.id);
            return;
        };
        let shape = param.lazy_shape().dims;
        match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => {
                let (values, dtype) = params::to_host_f32(g);
                self.host[i] = Some(values);
                self.meta[i] = Some(Meta { shape, dtype });
            }
            None => {
                self.meta[i] = Some(Meta {
                    shape,
                    dtype: param.val().dtype(),
                });
            }
        }
    }
}

struct Writer<'a, 'c, B: AutodiffBackend> {
    reducer: &'a Reducer<'c, f32>,
    index: &'a HashMap<ParamId, usize>,
    meta: &'a [Meta],
    unused: &'a [usize],
    grads: &'a mut GradientsParams,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Writer<'_, '_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(&i) = self.index.get(&param.id) else {
            return;
        };
        if self.unused.contains(&i) {
            return;
        }
        // After a synchronised finish() every bucket is idle and holds the
        // average, so each parameter has a gradient to read.
        let Some(avg) = self.reducer.grad(i) else {
            return;
        };
        let device = param.val().device();
        let meta = &self.meta[i];
        let g: Tensor<B, D> = params::from_host_f32(avg, meta.shape.clone(), meta.dtype, &device);
        self.grads
            .register::<B::InnerBackend, D>(param.id, g.inner());
    }
}
