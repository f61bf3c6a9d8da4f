//! Sharded data parallel through a real framework: Candle (candle-core,
//! candle-nn) on the CPU computes, ferroccl's FSDP layer keeps the
//! parameters, gradients and optimizer state sharded.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --features candle --example candle_fsdp
//! target/release/ferroccl-run -n 2 -- target/release/examples/candle_fsdp --steps 50
//! ```
//!
//! How it fits a framework: each Linear layer (weight, bias) is one FSDP
//! unit. Before a layer's forward its unit is gathered and copied into the
//! layer's Candle variables; Candle builds its graph as usual. Candle's
//! `backward()` computes every gradient at once (it has no per-tensor
//! hooks), so the loop then walks the units last first: `pre_backward`,
//! the unit's gradients from Candle's `GradStore` as one flat gradient,
//! `post_backward` (the reduce-scatter starts while the next unit is
//! copied out). The update is FSDP's sharded Adam or SGD, not Candle's
//! optimizer: the shards are what is updated.
//!
//! What this does not save: Candle's graph holds every layer's variables
//! until backward, so the whole model is resident in Candle's tensors
//! during a step (the gathered copies are freed on FSDP's side only). The
//! sharded gradients and optimizer state, and the master weights, are
//! saved. A framework with per-layer hooks and re-materialisation (as
//! PyTorch's FSDP has) can free a layer's weights between forward and
//! backward; `examples/mlp_fsdp/` does, with a hand-written backward.
//!
//! Flags: `--steps` [50], `--batch` [32] global, `--hidden` [64], `--lr`
//! [0.01], `--optimizer` adam | sgd [adam], `--strategy` full | grad-op |
//! none | hybrid:G [full].

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Linear, Module, VarBuilder, VarMap};
use ferroccl::fsdp::{Fsdp, FsdpConfig, Optimizer, Strategy, TensorSpec, UnitSpec};
use ferroccl::{Communicator, ReduceOp};

#[path = "common/candle_data.rs"]
mod candle_data;
use candle_data::{arg, batch as sample_batch, initial, layer_dims, num, BoxError, LAYERS};

fn strategy() -> Result<Strategy, BoxError> {
    Ok(match arg("--strategy").as_deref() {
        None | Some("full") => Strategy::FullShard,
        Some("grad-op") => Strategy::ShardGradOp,
        Some("none") => Strategy::NoShard,
        Some(h) if h.starts_with("hybrid:") => Strategy::HybridShard {
            group: h["hybrid:".len()..].parse()?,
        },
        Some(other) => return Err(format!("unknown --strategy {other}").into()),
    })
}

fn main() -> Result<(), BoxError> {
    let steps = num("--steps", 50.0)? as usize;
    let batch = num("--batch", 32.0)? as usize;
    let hidden = num("--hidden", 64.0)? as usize;
    let lr = num("--lr", 0.01)? as f32;
    let optimizer = match arg("--optimizer").as_deref() {
        None | Some("adam") => Optimizer::adam(lr),
        Some("sgd") => Optimizer::Sgd { lr },
        Some(other) => return Err(format!("unknown --optimizer {other}").into()),
    };

    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());
    if !batch.is_multiple_of(size) {
        return Err(format!("--batch {batch} is not divisible by {size} ranks").into());
    }
    let shard = batch / size;
    let dev = Device::Cpu;

    // The model, built the framework's way. Its initial values do not
    // matter: every forward copies the gathered unit in first.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let dims = layer_dims(hidden);
    let layers: Vec<Linear> = dims
        .iter()
        .enumerate()
        .map(|(l, &(i, o))| candle_nn::linear(i, o, vb.pp(format!("fc{l}"))))
        .collect::<candle_core::Result<_>>()?;
    // Each layer's (weight, bias) variables, in unit order.
    let vars: Vec<[Var; 2]> = {
        let data = varmap.data().lock().map_err(|e| e.to_string())?;
        let get = |n: String| data.get(&n).cloned().ok_or(format!("no variable {n}"));
        (0..LAYERS)
            .map(|l| Ok([get(format!("fc{l}.weight"))?, get(format!("fc{l}.bias"))?]))
            .collect::<Result<_, String>>()?
    };

    // One unit per layer; every rank fills its own shard from a fixed
    // draw (a hash of the element's place, Kaiming-uniform scale), so runs
    // on any number of ranks and with any strategy train the same model.
    let units: Vec<UnitSpec> = dims
        .iter()
        .enumerate()
        .map(|(l, &(i, o))| {
            UnitSpec::new(
                format!("fc{l}"),
                vec![
                    TensorSpec::new("weight", &[o, i]),
                    TensorSpec::new("bias", &[o]),
                ],
            )
        })
        .collect();
    let config = FsdpConfig {
        strategy: strategy()?,
        ..FsdpConfig::default()
    };
    let mut fsdp = Fsdp::new(&comm, units, config, |u, start, out| {
        let fan_in = dims[u].0 as f32;
        for (k, x) in out.iter_mut().enumerate() {
            *x = initial(u, start + k, fan_in);
        }
    })?;

    let mut loss_value = 0f32;
    for step in 0..steps {
        let first = step * batch + rank * shard;
        let (x, t) = sample_batch(first, shard, &dev)?;
        let mut h = x;
        for (l, layer) in layers.iter().enumerate() {
            // Gather the unit (prefetched by the previous layer's call) and
            // put it where Candle computes from.
            fsdp.pre_forward(l)?;
            let flat = fsdp.params(l)?;
            let [w, b] = &vars[l];
            let nw = w.elem_count();
            w.set(&Tensor::from_slice(&flat[..nw], w.shape(), &dev)?)?;
            b.set(&Tensor::from_slice(&flat[nw..], b.shape(), &dev)?)?;
            fsdp.post_forward(l)?;
            h = layer.forward(&h)?;
            if l + 1 < LAYERS {
                h = h.relu()?;
            }
        }
        let loss = candle_nn::loss::mse(&h, &t)?;
        loss_value = loss.to_scalar::<f32>()?;

        let grads = loss.backward()?;
        for l in (0..LAYERS).rev() {
            fsdp.pre_backward(l)?;
            let mut flat = Vec::with_capacity(fsdp.unit_len(l));
            for v in &vars[l] {
                match grads.get(v) {
                    Some(g) => flat.extend(g.flatten_all()?.to_vec1::<f32>()?),
                    None => flat.extend(std::iter::repeat_n(0.0, v.elem_count())),
                }
            }
            fsdp.post_backward(l, &flat)?;
        }
        fsdp.finish_backward()?;
        fsdp.step(&optimizer)?;
        if rank == 0 && (step % 10 == 0 || step + 1 == steps) {
            println!("step {step}: local loss {loss_value:.6}");
        }
    }

    let mut loss = [loss_value];
    comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    let memory = fsdp.memory();
    // The whole model on rank 0 (what a checkpoint would save).
    if let Some(full) = fsdp.full_state(0)? {
        let checksum: f64 = full
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, &v)| f64::from(v) * (1.0 + (i % 7) as f64))
            .sum();
        println!(
            "ranks={size} steps={steps} loss={:.6} checksum={checksum:.6} \
             params_bytes={} grads_bytes={} optim_bytes={}",
            loss[0], memory.params, memory.grads, memory.optim
        );
    }
    Ok(())
}
