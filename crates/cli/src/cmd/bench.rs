//! `shoal bench`: IOR- and mdtest-style benchmarks (io, md, suite). The work is in the
//! `shoal-bench` crate; this file hands it the global flags and turns its usage errors into
//! exit status 2. The hidden `shoal bench worker` is the process each benchmark rank runs
//! (the benchmark re-executes this binary); under mpirun the ranks are `shoal bench io|md`
//! processes themselves, rank 0 driving the others over TCP.

use super::Ctx;
use anyhow::Result;

pub use shoal_bench::BenchCmd;

pub async fn run(ctx: &Ctx, c: BenchCmd) -> Result<()> {
    shoal_bench::run(ctx.config.clone(), ctx.timeout, c).await.map_err(|e| {
        match e.downcast_ref::<shoal_bench::UsageError>() {
            Some(u) => super::usage(u.0.clone()),
            None => e,
        }
    })
}
