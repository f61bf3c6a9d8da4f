//! Optimizers that update one shard at a time: each rank holds the state
//! of its own elements only (FSDP's sharded optimizer state).

/// An optimizer over flat f32 shards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Adam (Kingma and Ba), with bias correction, as `torch.optim.Adam`
    /// without weight decay or amsgrad.
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to the root of the second moment.
        eps: f32,
    },
}

impl Optimizer {
    /// Adam with PyTorch's defaults for everything but `lr` (0.9, 0.999,
    /// 1e-8).
    pub fn adam(lr: f32) -> Self {
        Optimizer::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// f32 state values kept per parameter element.
    pub fn state_per_element(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adam { .. } => 2,
        }
    }

    /// Update `param` from `grad` (the same length) at step `t` (from 1),
    /// with `state` of `state_per_element() * param.len()` values (Adam:
    /// the first moments, then the second), zero before the first step.
    /// What `Fsdp::step` does to each shard; public so that whole
    /// parameters (a DDP loop, a reference) can be updated the same way.
    ///
    /// # Panics
    /// If `grad` or `state` is shorter than the above.
    pub fn update(&self, param: &mut [f32], grad: &[f32], state: &mut [f32], t: u64) {
        match *self {
            Optimizer::Sgd { lr } => {
                for (w, g) in param.iter_mut().zip(grad) {
                    *w -= lr * g;
                }
            }
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let (m, v) = state.split_at_mut(param.len());
                let t = i32::try_from(t).unwrap_or(i32::MAX);
                let c1 = 1.0 - beta1.powi(t);
                let c2 = 1.0 - beta2.powi(t);
                for i in 0..param.len() {
                    let g = grad[i];
                    m[i] = beta1 * m[i] + (1.0 - beta1) * g;
                    v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
                    let mh = m[i] / c1;
                    let vh = v[i] / c2;
                    param[i] -= lr * mh / (vh.sqrt() + eps);
                }
            }
        }
    }
}
