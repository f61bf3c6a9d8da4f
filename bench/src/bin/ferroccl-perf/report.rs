//! The table rank 0 prints: its header (the job, the ranks, the
//! settings), one timed column per mode ([`Measure`]), one row per size
//! ([`Row`]) and the summary ([`Report`]).

use super::AnyResult;
use ferroccl::reduce::SimdLevel;
use ferroccl::{Communicator, DataType, Element, ReduceOp};
use ferroccl_bench::coll::{bandwidth, Coll};
use ferroccl_bench::options::{Device, Options};
use std::io::Write;

/// One timed column: out-of-place or in-place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measure {
    /// Max over ranks of the mean time per call, seconds.
    pub(crate) seconds: f64,
    pub(crate) algbw: f64,
    pub(crate) busbw: f64,
    /// Wrong elements over all ranks; `None` without `-c 1`.
    pub(crate) wrong: Option<u64>,
}

impl Measure {
    pub(crate) fn new(
        coll: Coll,
        ranks: usize,
        bytes: usize,
        seconds: f64,
        wrong: Option<u64>,
    ) -> Measure {
        let (algbw, busbw) = bandwidth(coll, ranks, bytes, seconds);
        Measure {
            seconds,
            algbw,
            busbw,
            wrong,
        }
    }
}

/// One row of the table.
pub(crate) struct Row {
    pub(crate) bytes: usize,
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) root: Option<usize>,
    pub(crate) out_of_place: Measure,
    pub(crate) in_place: Option<Measure>,
}

impl Row {
    /// The row of `count` elements of `T`.
    pub(crate) fn new<T: Element>(
        opts: &Options,
        op: Option<ReduceOp>,
        count: usize,
        out_of_place: Measure,
        in_place: Option<Measure>,
    ) -> Row {
        Row {
            bytes: count * std::mem::size_of::<T>(),
            count,
            dtype: T::DTYPE,
            op: if opts.coll.reduces() { op } else { None },
            root: opts.coll.rooted().then_some(opts.root),
            out_of_place,
            in_place,
        }
    }
}

/// Where rows go: the table on rank 0's stdout and the CSV file; and the
/// totals of the closing lines.
pub(crate) struct Report {
    pub(crate) print: bool,
    pub(crate) coll: Coll,
    pub(crate) ranks: usize,
    pub(crate) csv: Option<std::io::BufWriter<std::fs::File>>,
    pub(crate) busbw_sum: f64,
    pub(crate) busbw_rows: usize,
    pub(crate) wrong: u64,
}

impl Report {
    pub(crate) fn row(&mut self, row: &Row) -> AnyResult<()> {
        for m in std::iter::once(&row.out_of_place).chain(row.in_place.as_ref()) {
            self.busbw_sum += m.busbw;
            self.busbw_rows += 1;
            self.wrong += m.wrong.unwrap_or(0);
        }
        if !self.print {
            return Ok(());
        }
        let root = row.root.map_or("-1".to_string(), |r| r.to_string());
        let op = row.op.map_or("none", ReduceOp::name);
        let column = |m: Option<&Measure>| match m {
            Some(m) => format!(
                " {:>10.2} {:>7.2} {:>7.2} {:>6}",
                m.seconds * 1e6,
                m.algbw,
                m.busbw,
                m.wrong.map_or("N/A".to_string(), |w| w.to_string())
            ),
            None => format!(" {:>10} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A"),
        };
        println!(
            "{:>12} {:>12} {:>8} {:>6} {:>6} {} {}",
            row.bytes,
            row.count,
            row.dtype.name(),
            op,
            root,
            column(Some(&row.out_of_place)),
            column(row.in_place.as_ref())
        );
        std::io::stdout().flush()?;
        if let Some(csv) = self.csv.as_mut() {
            let cells = |m: Option<&Measure>| match m {
                Some(m) => format!(
                    "{:.3},{:.4},{:.4},{}",
                    m.seconds * 1e6,
                    m.algbw,
                    m.busbw,
                    m.wrong.map_or(String::new(), |w| w.to_string())
                ),
                None => ",,,".to_string(),
            };
            writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{}",
                self.coll,
                self.ranks,
                row.bytes,
                row.count,
                row.dtype.name(),
                op,
                root,
                cells(Some(&row.out_of_place)),
                cells(row.in_place.as_ref())
            )?;
        }
        Ok(())
    }
}

pub(crate) fn print_header(
    opts: &Options,
    comm: &Communicator,
    infos: &[String],
    pinned: &[String],
) {
    let cfg = comm.config();
    if opts.threads > 1 {
        let processes = comm.size() / opts.threads;
        println!(
            "# ferroccl-perf: {} on {} ranks ({processes} process{} x {} threads)",
            opts.coll,
            comm.size(),
            if processes == 1 { "" } else { "es" },
            opts.threads
        );
    } else {
        println!("# ferroccl-perf: {} on {} ranks", opts.coll, comm.size());
    }
    println!(
        "# minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {} root: {}{}",
        opts.min_bytes,
        opts.max_bytes,
        opts.step_factor,
        opts.warmup_iters,
        opts.iters,
        u8::from(opts.check),
        opts.root,
        if opts.fresh {
            " fresh: each call timed alone after the buffers are touched"
        } else {
            ""
        }
    );
    println!(
        "# ferroccl: transport {} buffsize {} steps {} slot {} B nsocks/peer {} kernels {}",
        cfg.transport.as_deref().unwrap_or("auto"),
        cfg.buffsize,
        cfg.steps,
        cfg.chunk_bytes(),
        cfg.nsocks_per_peer,
        SimdLevel::current()
    );
    if opts.windows {
        println!("# buffers: windows (-R 2), shared between the ranks where they can be");
    }
    if opts.device == Device::Cuda {
        println!("# buffers: CUDA device memory (--device cuda), times from CUDA events");
    }
    println!("#");
    println!("# Ranks (peer:transport)");
    for info in infos {
        println!("#  {info}");
    }
    // Each rank's own copy bandwidth, measured in turn: the ceiling of
    // staging a device buffer through host memory, which is what the
    // staged collectives' busbw is judged against.
    for p in pinned {
        println!("# pinned copy: {p}");
    }
    println!("#");
    // Rows: 48 columns of size..root, then two groups of 35.
    println!("#{:48}{:^35}{:^35}", "", "out-of-place", "in-place");
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}  {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>6}  {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}
