//! Where this process stands in a parallel job, read from the launcher's environment:
//! Slurm (`srun`), Open MPI (`mpirun`), or any PMI/PMIx launcher (MPICH, Intel MPI).
//!
//! `shoal job` runs one rank per node and links no MPI library: rank and size are all it
//! needs to split the work, and the node-local rank (several ranks on one host, as in the
//! tests) only shifts the ports so that such ranks do not collide.

use anyhow::{anyhow, bail, Result};

/// Which launcher said so, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Slurm,
    OpenMpi,
    Pmi,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Slurm => "Slurm",
            Kind::OpenMpi => "Open MPI",
            Kind::Pmi => "PMI",
        }
    }
}

/// This process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub kind: Kind,
    pub rank: u32,
    pub size: u32,
    /// Index of this rank among the job's ranks on the same host (0 when the launcher does
    /// not say: one rank per node is the normal case).
    pub local_rank: u32,
    /// How many ranks of the job share this host, when the launcher says.
    pub local_size: Option<u32>,
    /// The launcher's id of the job, when it gives one (names the node-local folder).
    pub job: Option<String>,
}

/// The variables one launcher sets.
struct Vars {
    kind: Kind,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
    /// Tried in order for the job's id.
    jobs: &'static [&'static str],
}

/// In the order tried. Slurm comes first: `srun` of an Open MPI program exports both, and
/// Slurm's ids are the ones a user sees in `squeue`.
const LAUNCHERS: [Vars; 4] = [
    Vars {
        kind: Kind::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: "SLURM_NTASKS_PER_NODE",
        jobs: &["SLURM_JOB_ID"],
    },
    Vars {
        kind: Kind::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
        jobs: &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"],
    },
    Vars {
        kind: Kind::Pmi,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
        jobs: &["PMI_JOBID"],
    },
    Vars {
        kind: Kind::Pmi,
        rank: "PMIX_RANK",
        size: "PMIX_SIZE",
        local_rank: "PMIX_LOCAL_RANK",
        local_size: "PMIX_LOCAL_SIZE",
        jobs: &["PMIX_NAMESPACE"],
    },
];

impl Launch {
    /// From this process's environment; `None` when no launcher started it.
    pub fn detect() -> Result<Option<Launch>> {
        Launch::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        for v in LAUNCHERS {
            let (kind, rv, sv, lrv, lsv, jobs) = (v.kind, v.rank, v.size, v.local_rank, v.local_size, v.jobs);
            let (Some(r), Some(s)) = (get(rv), get(sv)) else { continue };
            let rank: u32 = r.trim().parse().map_err(|_| anyhow!("{rv}={r:?} is not a rank"))?;
            let size: u32 = s.trim().parse().map_err(|_| anyhow!("{sv}={s:?} is not a number of ranks"))?;
            if size == 0 || rank >= size {
                bail!("{rv}={rank} and {sv}={size} do not describe a rank of a job");
            }
            // Slurm writes the tasks per node as "2(x3)" on uneven layouts: only a plain
            // number counts; an unreadable one is as good as none.
            let local_size = get(lsv).and_then(|v| v.trim().parse().ok());
            let local_rank = get(lrv).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
            let job = jobs.iter().find_map(|v| get(v)).map(|j| j.trim().to_string()).filter(|j| !j.is_empty());
            return Ok(Some(Launch { kind, rank, size, local_rank, local_size, job }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(vars: &[(&str, &str)]) -> Result<Option<Launch>> {
        Launch::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn reads_each_launcher() {
        let l = of(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "1234")])
            .unwrap()
            .unwrap();
        assert_eq!((l.kind, l.rank, l.size, l.local_rank, l.job.as_deref()), (Kind::Slurm, 3, 8, 0, Some("1234")));
        let l = of(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "777"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((l.kind, l.rank, l.size, l.local_rank, l.local_size), (Kind::OpenMpi, 1, 4, 1, Some(4)));
        let l = of(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]).unwrap().unwrap();
        assert_eq!((l.kind, l.rank, l.size, l.local_rank, l.job), (Kind::Pmi, 0, 2, 0, None));
        // Slurm wins over the Open MPI variables srun also exports.
        let l = of(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(l.kind, Kind::Slurm);
        assert_eq!(
            of(&[("SLURM_NTASKS_PER_NODE", "2(x3)"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "6")])
                .unwrap()
                .unwrap()
                .local_size,
            None
        );
    }

    #[test]
    fn refuses_nonsense_and_none_without_a_launcher() {
        assert!(of(&[]).unwrap().is_none());
        assert!(of(&[("PMI_RANK", "4"), ("PMI_SIZE", "4")]).is_err());
        assert!(of(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "4")]).is_err());
    }
}
