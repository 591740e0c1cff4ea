//! CLOCK_MONOTONIC in nanoseconds: one clock for every process on this machine, so the
//! parent can tell workers when to start a phase and compare their start and end times.

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wait until the monotonic clock reaches `t` (sleep, then spin for the last stretch).
pub async fn wait_until(t: u64) {
    loop {
        let now = mono_ns();
        if now >= t {
            return;
        }
        let left = t - now;
        if left > 3_000_000 {
            tokio::time::sleep(std::time::Duration::from_nanos(left - 2_000_000)).await;
        } else {
            std::hint::spin_loop();
        }
    }
}

/// CPU time (user + system) this process has used, in nanoseconds.
pub fn self_cpu_ns() -> u64 {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Busy time of all CPUs of the machine so far (everything but idle and iowait), in
/// nanoseconds, from /proc/stat; `None` where that file is missing.
pub fn machine_busy_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal …
    let busy: u64 = v.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, x)| *x).take(8).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(busy * (1_000_000_000 / hz))
}
