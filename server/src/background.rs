//! Threads of their own for the background workers (write-behind, reaper,
//! ingestion lanes, reconciliation, verification, the counters' keeper),
//! which can run at a lower scheduling priority than the threads that answer
//! requests (`--background-nice`; by default the same priority: on two cores
//! shared with Redis and PostgreSQL a nice value of 10 showed no gain for
//! checkout's p99 and slowed the first second of a step, BENCHMARKS.md).
//!
//! Why: on a machine shared with Redis and PostgreSQL, a write-behind batch
//! decoded or a feed page applied on a request thread holds that CPU while
//! checkout requests wait behind it in the run queue; every checkout's
//! latency then includes the bookkeeping of sales already made. On threads
//! with a higher nice value the kernel runs them whenever a CPU is free and
//! preempts them for a request thread that wakes, so the background work
//! takes what checkout leaves, and lags under saturation instead of slowing
//! the sale (their lag is measured and bounded elsewhere: the write-behind's
//! lag gauge, the lanes' pending counts).
//!
//! A socket's I/O is driven by the runtime that opened it, so the workers
//! talk to Redis over connections opened here, never over the request
//! threads' shared one (which a worker would otherwise reopen after a
//! failure, moving checkout's I/O onto these threads; see
//! `Workers::start`). The failover watch stays on the request threads: a
//! shard fenced late could sell what its old master lost.
//!
//! Not yet isolated, and so a cost only with `--background-nice` above 0 on
//! busy CPUs: PostgreSQL's pool is shared, and a connection a worker opened
//! is driven here, so a request that borrows it waits on these threads too
//! (pages, and the token check every API call repeats against PostgreSQL
//! once its cached answer is 5 s old, reservations included, bounded by the
//! 300 ms quick lookup); and after a cluster failover the failover watch
//! reopens every cluster link of the process from the request threads,
//! which moves the workers' Redis I/O there.

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// Thread name of the background runtime's threads (`ps -L`, `top -H`).
pub const THREAD_NAME: &str = "holdfast-bg";

/// How the background runtime is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackgroundConfig {
    /// Its worker threads.
    pub threads: usize,
    /// The nice value added to theirs (0 to 19; 0: the same priority as the
    /// request threads). Raising a nice value needs no privilege.
    pub nice: i32,
}

/// The background runtime. Dropping it lets its threads finish on their own
/// (the workers are stopped and awaited before that, see `Workers::stop`).
pub struct Background {
    runtime: Option<Runtime>,
}

impl Background {
    /// Starts the runtime's threads, each lowering its own priority first.
    pub fn start(config: BackgroundConfig) -> io::Result<Self> {
        let nice = config.nice;
        let runtime = Builder::new_multi_thread()
            .worker_threads(config.threads.max(1))
            .thread_name(THREAD_NAME)
            .on_thread_start(move || {
                if let Err(e) = lower_priority(nice) {
                    // The work still runs, only at the request threads' priority.
                    tracing::warn!(error = %e, nice, "a background thread kept its priority");
                }
            })
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Where to spawn background work.
    pub fn handle(&self) -> Handle {
        self.runtime
            .as_ref()
            .map_or_else(Handle::current, |r| r.handle().clone())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // A runtime dropped from async code would block its caller's thread
        // (tokio refuses); the workers were awaited already.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Adds `nice` to the calling thread's nice value. On Linux the nice value
/// belongs to each thread (`setpriority(PRIO_PROCESS, 0, …)` names the caller).
fn lower_priority(nice: i32) -> io::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    let current = rustix::process::getpriority_process(None)?;
    rustix::process::setpriority_process(None, current + nice)?;
    Ok(())
}
