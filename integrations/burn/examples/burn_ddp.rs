//! A Burn model trained data-parallel across processes on ferroccl, with
//! burn-train's `Learner` (the default) or a hand-written loop.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl-burn --bin ferroccl-run --example burn_ddp
//! target/release/ferroccl-run -n 2 -- target/release/examples/burn_ddp --model cnn
//! target/release/ferroccl-run -n 3 -- target/release/examples/burn_ddp --model mlp --loop
//! ```
//!
//! The model is a small regression network on 8x8 inputs generated here
//! (no downloads): `--model mlp` (64 -> 16 -> 4) or `--model cnn` (a 3x3
//! convolution with 4 channels, then 144 -> 16 -> 4). Each global batch of
//! `--batch` samples is split evenly: rank r of n trains on its n-th of
//! every batch (the sampler is the user's: here a dataset per rank). With
//! the `Learner` the only change from one process is the training
//! strategy (`TrainingStrategy::Custom(ferroccl_burn::DataParallel)`);
//! `--loop` calls `GradientSync::sync` between backward and the optimizer.
//!
//! Prints the loss per epoch and, at the end, a checksum of the weights
//! (`rank=R checksum=...`, the same on every rank). Flags: `--epochs` [3],
//! `--steps` [4] per epoch, `--batch` [12], `--lr` [0.05], `--dump FILE`
//! (rank 0 writes every weight, one per line), `--bound` (one process,
//! `--loop` only: also print `gabs=`, the largest mean absolute per-sample
//! gradient component, for the tests' tolerance), `--hidden` [16] (the
//! hidden width), `--bench` (`--loop` only: time each step after the
//! first epoch and the share spent in `GradientSync::sync`), `--die-rank R
//! --die-step K` (rank R aborts at its K-th step: the others must report
//! it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ferroccl_burn::burn;

use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn::train::metric::LossMetric;
use burn::train::metric::{MetricDefinition, NumericEntry};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, TrainingProgress,
};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
    TrainingStrategy,
};
use ferroccl::{Communicator, ReduceOp};

type Inner = NdArray<f32>;
type Train = Autodiff<Inner>;
type BoxError = Box<dyn std::error::Error>;

const SIDE: usize = 8;
const D_IN: usize = SIDE * SIDE;
const D_OUT: usize = 4;
const CHANNELS: usize = 4;

#[derive(Module, Debug)]
struct Net<B: Backend> {
    conv: Option<Conv2d<B>>,
    fc1: Linear<B>,
    fc2: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(cnn: bool, hidden: usize, device: &B::Device) -> Self {
        let conv = cnn.then(|| Conv2dConfig::new([1, CHANNELS], [3, 3]).init(device));
        let flat = if cnn {
            CHANNELS * (SIDE - 2) * (SIDE - 2)
        } else {
            D_IN
        };
        Net {
            conv,
            fc1: LinearConfig::new(flat, hidden).init(device),
            fc2: LinearConfig::new(hidden, D_OUT).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [batch, _] = x.dims();
        let x = match &self.conv {
            Some(conv) => {
                let y = relu(conv.forward(x.reshape([batch, 1, SIDE, SIDE])));
                y.reshape([batch, CHANNELS * (SIDE - 2) * (SIDE - 2)])
            }
            None => x,
        };
        self.fc2.forward(relu(self.fc1.forward(x)))
    }

    fn loss(&self, batch: &Batch<B>) -> (Tensor<B, 1>, Tensor<B, 2>) {
        let out = self.forward(batch.x.clone());
        let loss = MseLoss::new().forward(out.clone(), batch.y.clone(), Reduction::Mean);
        (loss, out)
    }
}

/// Steps taken by this process, for `--die-step`.
static STEPS: AtomicUsize = AtomicUsize::new(0);
/// (rank, step) at which this process aborts, if any.
static DIE_AT: Mutex<Option<usize>> = Mutex::new(None);

fn count_step() {
    let n = STEPS.fetch_add(1, Ordering::SeqCst) + 1;
    if *DIE_AT.lock().unwrap() == Some(n) {
        eprintln!("burn_ddp: aborting at step {n} (--die-step)");
        std::process::abort();
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> TrainOutput<RegressionOutput<B>> {
        count_step();
        let (loss, out) = self.loss(&batch);
        let grads = GradientsParams::from_grads::<B, Self>(loss.backward(), self);
        TrainOutput {
            grads,
            item: RegressionOutput::new(loss, out, batch.y),
        }
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> RegressionOutput<B> {
        let (loss, out) = self.loss(&batch);
        RegressionOutput::new(loss, out, batch.y)
    }
}

#[derive(Clone, Debug)]
struct Sample {
    x: Vec<f32>,
    y: Vec<f32>,
}

/// Sample `i` of the stream: a smooth 8x8 "image" and a fixed function of
/// it as the target.
fn sample(i: usize) -> Sample {
    let x: Vec<f32> = (0..D_IN)
        .map(|j| ((i * 7 + j * 3) as f32 * 0.37).sin() + 0.05 * (j % SIDE) as f32)
        .collect();
    let y = (0..D_OUT)
        .map(|o| (x[o * 9] * x[(o * 13 + 5) % D_IN] + 0.5 * x[(o * 17 + 9) % D_IN]).tanh())
        .collect();
    Sample { x, y }
}

#[derive(Clone, Debug)]
struct Batch<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
}

#[derive(Clone, Default)]
struct SampleBatcher;

impl<B: Backend> Batcher<B, Sample, Batch<B>> for SampleBatcher {
    fn batch(&self, items: Vec<Sample>, device: &B::Device) -> Batch<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|s| s.x.iter().copied()).collect();
        let y: Vec<f32> = items.iter().flat_map(|s| s.y.iter().copied()).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [n, D_IN]), device),
            y: Tensor::from_data(TensorData::new(y, [n, D_OUT]), device),
        }
    }
}

/// This rank's samples: its `batch / size` consecutive samples of every
/// global batch, in step order, so that its k-th local batch is its share
/// of global batch k.
fn shard(rank: usize, size: usize, steps: usize, batch: usize) -> Vec<Sample> {
    let local = batch / size;
    (0..steps)
        .flat_map(|s| (0..local).map(move |i| sample(s * batch + rank * local + i)))
        .collect()
}

struct Args {
    cnn: bool,
    learner: bool,
    epochs: usize,
    steps: usize,
    batch: usize,
    lr: f64,
    dump: Option<String>,
    bound: bool,
    die_rank: Option<usize>,
    die_step: usize,
    hidden: usize,
    bench: bool,
}

fn parse() -> Result<Args, BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| -> Result<Option<String>, BoxError> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(Some(
                args.get(i + 1)
                    .ok_or(format!("{name} needs a value"))?
                    .clone(),
            )),
            None => Ok(None),
        }
    };
    let num = |name: &str, default: usize| -> Result<usize, BoxError> {
        Ok(match value(name)? {
            Some(v) => v.parse()?,
            None => default,
        })
    };
    let model = value("--model")?.unwrap_or_else(|| "mlp".into());
    if model != "mlp" && model != "cnn" {
        return Err(format!("--model is mlp or cnn, not {model}").into());
    }
    Ok(Args {
        cnn: model == "cnn",
        learner: !args.iter().any(|a| a == "--loop"),
        epochs: num("--epochs", 3)?,
        steps: num("--steps", 4)?,
        batch: num("--batch", 12)?,
        lr: match value("--lr")? {
            Some(v) => v.parse()?,
            None => 0.05,
        },
        dump: value("--dump")?,
        bound: args.iter().any(|a| a == "--bound"),
        die_rank: value("--die-rank")?.map(|v| v.parse()).transpose()?,
        die_step: num("--die-step", 2)?,
        hidden: num("--hidden", 16)?,
        bench: args.iter().any(|a| a == "--bench"),
    })
}

fn main() {
    if let Err(e) = run() {
        // The error's text names a failed peer's rank (ferroccl's
        // `PeerFailed`); a launcher prefixes the line with this rank.
        eprintln!("burn_ddp: error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let args = parse()?;
    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());
    if args.batch == 0 || !args.batch.is_multiple_of(size) {
        return Err(format!("--batch {} is not a multiple of {size} ranks", args.batch).into());
    }
    if args.bound && (size != 1 || args.learner) {
        return Err("--bound needs one process and --loop".into());
    }
    if args.die_rank == Some(rank) {
        *DIE_AT.lock().unwrap() = Some(args.die_step);
    }
    let device = Default::default();
    // Every rank starts from different weights; the broadcast makes them
    // rank 0's, which are one process's with the same seed.
    Train::seed(&device, 42 + rank as u64);
    let model: Net<Train> = Net::new(args.cnn, args.hidden, &device);
    let data = shard(rank, size, args.steps, args.batch);

    let (model, comm) = if args.learner {
        train_learner(comm, model, data, &args)?
    } else {
        let model = train_loop(&comm, model, data, &args)?;
        (model.valid(), comm)
    };

    let weights = flat_weights(&model);
    let checksum: f64 = weights
        .iter()
        .enumerate()
        .map(|(i, w)| (1 + i % 7) as f64 * *w as f64)
        .sum();
    println!(
        "rank={rank} checksum={checksum:.9} weights={}",
        weights.len()
    );
    if rank == 0 {
        if let Some(path) = &args.dump {
            let text: String = weights.iter().map(|w| format!("{w:?}\n")).collect();
            std::fs::write(path, text)?;
        }
    }
    comm.barrier()?;
    Ok(())
}

/// burn-train's `Learner`, with ferroccl's strategy instead of Burn's
/// single-device one: the only line that differs from one process.
fn train_learner(
    comm: Communicator,
    model: Net<Train>,
    data: Vec<Sample>,
    args: &Args,
) -> Result<(Net<Inner>, Communicator), BoxError> {
    let size = comm.size();
    let device = Default::default();
    let train = DataLoaderBuilder::<Train, Sample, Batch<Train>>::new(SampleBatcher)
        .batch_size(args.batch / size)
        .build(InMemDataset::new(data.clone()));
    let valid = DataLoaderBuilder::<Inner, Sample, Batch<Inner>>::new(SampleBatcher)
        .batch_size(args.batch / size)
        .build(InMemDataset::new(data));
    let strategy = Arc::new(ferroccl_burn::DataParallel::new(comm, device));
    let dir = std::env::temp_dir().join(format!("burn_ddp-{}", std::process::id()));
    let learner = Learner::new(model, SgdConfig::new().init(), args.lr);
    let result = SupervisedTraining::new(&dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .num_epochs(args.epochs)
        .with_application_logger(None)
        .with_metric_logger(burn::train::logger::InMemoryMetricLogger::default())
        .renderer(EpochLoss::default())
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .launch(learner);
    let _ = std::fs::remove_dir_all(&dir);
    // A failed peer stopped training: its error, naming the rank.
    strategy.result()?;
    let strategy = Arc::try_unwrap(strategy).map_err(|_| "the strategy is still shared")?;
    Ok((result.model, strategy.into_communicator()))
}

/// A hand-written loop: backward, `GradientSync::sync`, the optimizer.
fn train_loop(
    comm: &Communicator,
    model: Net<Train>,
    data: Vec<Sample>,
    args: &Args,
) -> Result<Net<Train>, BoxError> {
    let size = comm.size();
    let device = Default::default();
    let mut model = ferroccl_burn::broadcast_module::<Train, _>(comm, model)?;
    let mut sync = ferroccl_burn::GradientSync::new(comm, &model, Default::default())?;
    let mut optim = SgdConfig::new().init();
    let local = args.batch / size;
    let mut gabs = 0f64;
    // --bench: time of each step and of its gradient sync, after the
    // first epoch (warm-up).
    let (mut step_s, mut sync_s, mut timed) = (0f64, 0f64, 0usize);
    for epoch in 1..=args.epochs {
        let mut loss_sum = 0f64;
        for step in 0..args.steps {
            let batch: Batch<Train> =
                SampleBatcher.batch(data[step * local..(step + 1) * local].to_vec(), &device);
            if args.bound {
                gabs = gabs.max(per_sample_abs(
                    &model,
                    &data[step * local..(step + 1) * local],
                ));
            }
            count_step();
            let t0 = std::time::Instant::now();
            let (loss, _) = model.loss(&batch);
            loss_sum += loss.clone().into_scalar() as f64;
            let grads = GradientsParams::from_grads::<Train, Net<Train>>(loss.backward(), &model);
            let t1 = std::time::Instant::now();
            let grads = sync.sync(&model, grads)?;
            let t2 = std::time::Instant::now();
            model = optim.step(args.lr, model, grads);
            if epoch > 1 {
                step_s += t0.elapsed().as_secs_f64();
                sync_s += (t2 - t1).as_secs_f64();
                timed += 1;
            }
        }
        let mut mean = [loss_sum / args.steps as f64];
        comm.all_reduce_in_place(&mut mean, ReduceOp::Avg)?;
        println!("epoch {epoch} loss {:.6}", mean[0]);
    }
    if args.bound {
        println!("gabs={gabs:e}");
    }
    if args.bench && timed > 0 {
        let params: usize = sync.reducer().bucket_layout().len();
        println!(
            "bench: ranks={size} local_batch={local} steps={timed} step_ms={:.3} sync_ms={:.3} \
             comm_share={:.1}% buckets={params}",
            1e3 * step_s / timed as f64,
            1e3 * sync_s / timed as f64,
            100.0 * sync_s / step_s
        );
    }
    Ok(model)
}

/// The largest, over gradient components, of the mean over the batch of
/// each sample's absolute gradient: what a sum over samples in any order
/// can lose to rounding scales with.
fn per_sample_abs(model: &Net<Train>, samples: &[Sample]) -> f64 {
    let device = Default::default();
    let mut acc: Vec<f64> = Vec::new();
    for s in samples {
        let one: Batch<Train> = SampleBatcher.batch(vec![s.clone()], &device);
        let (loss, _) = model.loss(&one);
        let grads = GradientsParams::from_grads::<Train, Net<Train>>(loss.backward(), model);
        let g = grads_flat(model, &grads);
        if acc.is_empty() {
            acc = vec![0.0; g.len()];
        }
        for (a, x) in acc.iter_mut().zip(g) {
            *a += (x as f64).abs() / samples.len() as f64;
        }
    }
    acc.into_iter().fold(0.0, f64::max)
}

fn grads_flat(model: &Net<Train>, grads: &GradientsParams) -> Vec<f32> {
    struct Collect<'a> {
        grads: &'a GradientsParams,
        out: Vec<f32>,
    }
    impl ModuleVisitor<Train> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Train, D>>) {
            if let Some(g) = self.grads.get::<Inner, D>(param.id) {
                self.out.extend(g.into_data().iter::<f32>());
            }
        }
    }
    let mut c = Collect {
        grads,
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

fn flat_weights<B: Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(param.val().into_data().iter::<f32>());
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Prints each epoch's mean training loss (this rank's batches) when the
/// next epoch starts, and the last one at the end; renders nothing else.
#[derive(Default)]
struct EpochLoss {
    epoch: usize,
    sum: f64,
    count: usize,
    /// The loss of the item about to be rendered (its epoch comes with
    /// `render_train`, after the metrics).
    last: Option<f64>,
}

impl EpochLoss {
    fn flush(&mut self) {
        if self.count > 0 {
            println!(
                "epoch {} loss {:.6}",
                self.epoch,
                self.sum / self.count as f64
            );
        }
        self.sum = 0.0;
        self.count = 0;
    }
}

impl MetricsRendererTraining for EpochLoss {
    fn update_train(&mut self, state: MetricState) {
        if let MetricState::Numeric(_, value) = state {
            let v = match value {
                NumericEntry::Value(v) => v,
                NumericEntry::Aggregated {
                    aggregated_value, ..
                } => aggregated_value,
            };
            self.last = Some(v);
        }
    }

    fn update_valid(&mut self, _state: MetricState) {}

    fn render_train(&mut self, item: TrainingProgress) {
        if item.epoch != self.epoch {
            self.flush();
            self.epoch = item.epoch;
        }
        if let Some(v) = self.last.take() {
            self.sum += v;
            self.count += 1;
        }
    }

    fn render_valid(&mut self, _item: TrainingProgress) {}

    fn on_train_end(
        &mut self,
        _summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        self.flush();
        Ok(())
    }
}

impl MetricsRendererEvaluation for EpochLoss {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress) {}
}

impl MetricsRenderer for EpochLoss {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
}
