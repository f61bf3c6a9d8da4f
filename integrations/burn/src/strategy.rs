//! A training strategy for burn-train's `Learner` (its custom strategy
//! seam, `TrainingStrategy::Custom`): the same epochs as Burn's
//! single-device strategy, with rank 0's weights broadcast first and every
//! optimizer step's gradients averaged over the ranks by [`GradientSync`].
//! A user of the `Learner` changes the strategy, not the loop. This module
//! owns the loop and the agreement between ranks on when it ends; the
//! gradient path is [`GradientSync`]'s.

use std::sync::Mutex;

use burn::data::dataloader::DataLoader;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::train::{EventProcessorTraining, LearnerEvent, LearnerItem};
use burn::train::{
    InferenceStep, Learner, LearningComponentsTypes, SupervisedLearningStrategy,
    SupervisedTrainingEventProcessor, TrainLoader, TrainStep, TrainingComponents, TrainingModel,
    ValidLoader,
};
use ferroccl::ddp::{AllReduceHook, Bf16CompressHook, Fp16CompressHook, ReducerConfig};
use ferroccl::{Communicator, Error, ReduceOp, Result};

use crate::{broadcast_module, GradientSync};

/// How gradient buckets travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// In f32, averaged exactly (one allreduce per bucket).
    #[default]
    None,
    /// Cast to f16 for the allreduce, half the bytes.
    Fp16,
    /// Cast to bf16 for the allreduce, half the bytes.
    Bf16,
}

/// Data-parallel training across processes for burn-train's `Learner`.
///
/// ```no_run
/// # fn doc<LC: burn::train::LearningComponentsTypes + Send + 'static>(
/// #     training: burn::train::SupervisedTraining<LC>,
/// #     learner: burn::train::Learner<LC>,
/// #     device: <LC::Backend as burn::tensor::backend::Backend>::Device,
/// # ) -> Result<(), ferroccl::Error> {
/// use std::sync::Arc;
/// let comm = ferroccl::Communicator::from_env()?;
/// let strategy = Arc::new(ferroccl_burn::DataParallel::new(comm, device));
/// let result = training
///     .with_training_strategy(burn::train::TrainingStrategy::Custom(strategy.clone()))
///     .launch(learner);
/// strategy.result()?; // a failed peer, named, as a ferroccl::Error
/// # Ok(()) }
/// ```
///
/// Each rank's data loaders hold that rank's share of the data (the user's
/// sampler: rank r takes items r, r + n, r + 2n, ... of a shuffled order,
/// the same count on every rank; checked at each epoch). Metrics and
/// validation are each rank's own; checkpoints are written by rank 0 only;
/// early stopping and the interrupter stop every rank at the end of the
/// same epoch (the ranks agree). With `grads_accumulation(k)`, k - 1
/// micro-steps accumulate locally and the k-th averages the sum; a
/// partial accumulation at the end of an epoch is averaged and applied.
///
/// A failure (a peer that died, a mismatch) stops training on this rank
/// through the learner's interrupter, with a message naming the rank, and
/// is kept for [`result`](Self::result).
pub struct DataParallel<D> {
    comm: Communicator,
    device: D,
    config: ReducerConfig,
    compression: Compression,
    error: Mutex<Option<Error>>,
}

impl<D> std::fmt::Debug for DataParallel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("compression", &self.compression)
            .finish()
    }
}

impl<D> DataParallel<D> {
    /// Train on `device` (this rank's), averaging over `comm`'s ranks with
    /// the reducer's default buckets.
    pub fn new(comm: Communicator, device: D) -> Self {
        DataParallel {
            comm,
            device,
            config: ReducerConfig::default(),
            compression: Compression::None,
            error: Mutex::new(None),
        }
    }

    /// Bucket sizes, prefix streaming, unused parameters (every rank the
    /// same).
    pub fn with_config(mut self, config: ReducerConfig) -> Self {
        self.config = config;
        self
    }

    /// Move gradients as f16 or bf16.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The communicator the strategy trains over.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The communicator back, once training is over.
    pub fn into_communicator(self) -> Communicator {
        self.comm
    }

    /// `Ok` unless training stopped on an error: then that error (for a
    /// dead peer, [`Error::PeerFailed`] naming its rank). Taken once.
    pub fn result(&self) -> Result<()> {
        match self.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<LC> SupervisedLearningStrategy<LC> for DataParallel<<LC::Backend as Backend>::Device>
where
    LC: LearningComponentsTypes,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let dataloader_train = dataloader_train.to_device(&self.device);
        let dataloader_valid = dataloader_valid.to_device(&self.device);
        learner.fork(&self.device);
        let TrainingComponents {
            num_epochs,
            checkpointer,
            grad_accumulation,
            interrupter,
            early_stopping,
            mut event_processor,
            event_store,
            ..
        } = components;
        let mut run = Run::<LC> {
            num_epochs,
            checkpointer,
            grad_accumulation,
            interrupter: interrupter.clone(),
            early_stopping,
            processor: &mut event_processor,
            event_store: &event_store,
        };
        if let Err(e) = self.run(
            &mut run,
            &mut learner,
            &*dataloader_train,
            &*dataloader_valid,
            starting_epoch,
        ) {
            let msg = format!("ferroccl-burn, rank {}: {e}", self.comm.rank());
            log_error(&msg);
            interrupter.stop(Some(&msg));
            *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
        (learner.model(), event_processor)
    }
}

/// Burn logs through the `log` facade, which this crate does not depend
/// on; the message goes to stderr so that a launcher shows it per rank.
fn log_error(msg: &str) {
    eprintln!("{msg}");
}

/// The parts of `TrainingComponents` the loop uses.
struct Run<'a, LC: LearningComponentsTypes> {
    num_epochs: usize,
    checkpointer: Option<burn::train::LearningCheckpointer<LC>>,
    grad_accumulation: Option<usize>,
    interrupter: burn::train::Interrupter,
    early_stopping: Option<Box<dyn burn::train::CloneEarlyStoppingStrategy>>,
    processor: &'a mut SupervisedTrainingEventProcessor<LC>,
    event_store: &'a burn::train::metric::store::EventStoreClient,
}

impl<D> DataParallel<D> {
    fn run<LC: LearningComponentsTypes>(
        &self,
        run: &mut Run<'_, LC>,
        learner: &mut Learner<LC>,
        train: &dyn DataLoader<LC::Backend, <LC::TrainingModel as TrainStep>::Input>,
        valid: &dyn DataLoader<
            <LC::Backend as burn::tensor::backend::AutodiffBackend>::InnerBackend,
            <LC::InferenceModel as InferenceStep>::Input,
        >,
        starting_epoch: usize,
    ) -> Result<()> {
        let comm = &self.comm;
        let model = broadcast_module(comm, learner.model())?;
        learner.load_model(burn::module::Module::into_record(model));
        let model = learner.model();
        let config = self.config.clone();
        let mut sync = match self.compression {
            Compression::None => GradientSync::with_hook(comm, &model, config, AllReduceHook),
            Compression::Fp16 => GradientSync::with_hook(comm, &model, config, Fp16CompressHook),
            Compression::Bf16 => GradientSync::with_hook(comm, &model, config, Bf16CompressHook),
        }?;
        let num_epochs = run.num_epochs;
        for epoch in starting_epoch..num_epochs + 1 {
            same_count(comm, "training", train.num_items())?;
            let mut iterator = train.iter();
            let mut iteration = 0;
            let mut pending = 0;
            while let Some(item) = iterator.next() {
                iteration += 1;
                learner.lr_step();
                let progress = iterator.progress();
                // The epoch's last batch always synchronises: a partial
                // accumulation is averaged and applied, not carried over.
                let last = progress.items_processed >= progress.items_total;
                let out = learner.train_step(item);
                let model = learner.model();
                match run.grad_accumulation {
                    Some(k) if pending + 1 < k && !last => {
                        sync.accumulate(&model, out.grads)?;
                        pending += 1;
                    }
                    _ => {
                        let grads = sync.sync(&model, out.grads)?;
                        learner.optimizer_step(grads);
                        pending = 0;
                    }
                }
                let item = LearnerItem::new(
                    out.item,
                    progress,
                    epoch,
                    num_epochs,
                    iteration,
                    Some(learner.lr_current()),
                );
                run.processor
                    .process_train(LearnerEvent::ProcessedItem(item));
            }
            run.processor.process_train(LearnerEvent::EndEpoch(epoch));

            let inference = learner.model().valid();
            let mut iterator = valid.iter();
            let mut iteration = 0;
            while let Some(item) = iterator.next() {
                iteration += 1;
                let progress = iterator.progress();
                let out = inference.step(item);
                let item = LearnerItem::new(out, progress, epoch, num_epochs, iteration, None);
                run.processor
                    .process_valid(LearnerEvent::ProcessedItem(item));
            }
            run.processor.process_valid(LearnerEvent::EndEpoch(epoch));

            if comm.rank() == 0 {
                if let Some(checkpointer) = &mut run.checkpointer {
                    checkpointer.checkpoint(learner, epoch, run.event_store);
                }
            }
            // Every rank ends after the same epoch: one local reason to
            // stop (early stopping on this rank's metrics, the
            // interrupter) stops them all.
            let mut stop = u8::from(run.interrupter.should_stop());
            if let Some(early) = &mut run.early_stopping {
                stop |= u8::from(early.should_stop(epoch, run.event_store));
            }
            let mut flag = [stop];
            comm.all_reduce_in_place(&mut flag, ReduceOp::Max)?;
            if flag[0] != 0 {
                break;
            }
        }
        Ok(())
    }
}

/// Every rank must see the same number of items per epoch, or one rank
/// would wait for a step another never takes.
fn same_count(comm: &Communicator, what: &str, n: usize) -> Result<()> {
    let mut all = vec![0u64; comm.size()];
    comm.all_gather(&[n as u64], &mut all)?;
    if let Some(r) = all.iter().position(|&x| x != all[0]) {
        return Err(Error::InvalidArgument(format!(
            "ferroccl-burn: the {what} data loader of rank {r} holds {} items, rank 0's {}: \
             every rank needs the same number (drop the remainder in the sampler)",
            all[r], all[0]
        )));
    }
    Ok(())
}
