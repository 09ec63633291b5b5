//! Quality gates and footprint (asiai's gates): `early_stop` (runs that stopped far short of
//! the others), the server's resident memory before and under load, KV-cache occupancy when the
//! server reports it, and whether another busy process shared the machine.
//!
//! Memory comes from `/proc/PID/status` when the benchmark started the server, else from the
//! Prometheus text at `/metrics` (`process_resident_memory_bytes`, as llama-server and vLLM
//! export it); KV occupancy from vLLM's `vllm:kv_cache_usage_perc` (Spindle exports it too).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;

/// A run is short when its completion is below this share of the median completion.
pub const EARLY_STOP_FRACTION: f64 = 0.5;
/// `early_stop` trips at this many short runs.
pub const EARLY_STOP_RUNS: usize = 2;
/// Cores another process must keep busy for the benchmark to warn.
pub const FOREIGN_CORES_WARNING: f64 = 0.5;
/// Prometheus name of the resident memory in bytes.
const RSS_METRIC: &str = "process_resident_memory_bytes";
/// Prometheus name of the share of KV blocks in use (0..1).
pub const KV_METRIC: &str = "vllm:kv_cache_usage_perc";

/// Completions that stopped early: fewer than [`EARLY_STOP_FRACTION`] × the median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlyStop {
    pub runs: usize,
    pub short: usize,
    pub median_completion: f64,
}

impl EarlyStop {
    /// The gate over the completion tokens of every measured call.
    pub fn of(completions: &[u32]) -> Self {
        let mut sorted = completions.to_vec();
        sorted.sort_unstable();
        let n = sorted.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => f64::from(sorted[n / 2]),
            _ => (f64::from(sorted[n / 2 - 1]) + f64::from(sorted[n / 2])) / 2.0,
        };
        let short =
            completions.iter().filter(|&&c| f64::from(c) < EARLY_STOP_FRACTION * median).count();
        Self { runs: n, short, median_completion: median }
    }

    /// Whether the gate tripped: at least [`EARLY_STOP_RUNS`] short runs.
    pub fn tripped(&self) -> bool {
        self.short >= EARLY_STOP_RUNS
    }
}

/// `VmRSS` of a `/proc/PID/status` text, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The value of the first sample of `name` in a Prometheus text exposition (any labels).
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = match rest.chars().next()? {
            ' ' => rest,
            '{' => &rest[rest.find('}')? + 1..],
            _ => return None,
        };
        value.split_whitespace().next()?.parse().ok()
    })
}

/// CPU time of the whole machine and of the benchmark's own processes, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct CpuSample {
    /// All CPUs' ticks (`/proc/stat` line `cpu`).
    pub total: u64,
    /// All CPUs' ticks not idle nor waiting for I/O.
    pub busy: u64,
    /// Ticks of this process, its finished children and the server it runs now.
    pub own: u64,
    pub cpus: u32,
}

impl CpuSample {
    /// Now, from `/proc` (`None` off Linux); `server` is the started server's process id.
    pub fn now(server: Option<u32>) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let (total, busy) = parse_cpu_line(&stat)?;
        let cpus = stat.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count();
        let ticks =
            |path: String| std::fs::read_to_string(path).ok().and_then(|t| parse_pid_ticks(&t));
        let own = ticks("/proc/self/stat".into()).unwrap_or(0)
            + server.and_then(|pid| ticks(format!("/proc/{pid}/stat"))).unwrap_or(0);
        Some(Self { total, busy, own, cpus: cpus.max(1) as u32 })
    }

    /// Cores that processes other than ours kept busy between `self` and `later`.
    pub fn foreign_cores(&self, later: &CpuSample) -> f64 {
        let elapsed = later.total.saturating_sub(self.total) as f64 / f64::from(self.cpus);
        if elapsed <= 0.0 {
            return 0.0;
        }
        let busy = later.busy.saturating_sub(self.busy);
        let own = later.own.saturating_sub(self.own);
        busy.saturating_sub(own) as f64 / elapsed
    }
}

/// `(total, busy)` ticks of the `cpu` line of `/proc/stat`: busy leaves out idle and iowait.
fn parse_cpu_line(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0);
    Some((total, total - idle))
}

/// CPU ticks of a `/proc/PID/stat` text: its own (`utime`, `stime`, fields 14 and 15) and its
/// waited-for children's (`cutime`, `cstime`, 16 and 17), so a server the benchmark restarted
/// still counts as its own.
fn parse_pid_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is the first after the name.
    (11..15).map(|i| fields.get(i)?.parse::<u64>().ok()).sum()
}

/// What one look at the server's footprint found.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Footprint {
    pub rss_bytes: Option<u64>,
    /// 0..1.
    pub kv_usage: Option<f64>,
}

impl Footprint {
    /// The larger of each figure.
    pub fn peak(self, other: Footprint) -> Footprint {
        let max_u = |a: Option<u64>, b: Option<u64>| a.max(b);
        let max_f = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Footprint {
            rss_bytes: max_u(self.rss_bytes, other.rss_bytes),
            kv_usage: max_f(self.kv_usage, other.kv_usage),
        }
    }
}

/// Where the server's footprint is read: its process (when started here) and its `/metrics`.
#[derive(Debug, Clone)]
pub struct Probe {
    client: Client,
    /// The started server's process id (0: none); follows restarts.
    pid: Arc<AtomicU32>,
}

impl Probe {
    pub fn new(client: Client, pid: Arc<AtomicU32>) -> Self {
        Self { client, pid }
    }

    /// The server's process id, if the benchmark started it.
    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|&p| p != 0)
    }

    /// Where memory figures come from: `/proc/PID` or `/metrics`.
    pub fn memory_source(&self) -> &'static str {
        if self.pid().is_some() {
            "/proc/PID/status VmRSS"
        } else {
            "/metrics process_resident_memory_bytes"
        }
    }

    /// The footprint now.
    pub async fn sample(&self) -> Footprint {
        let metrics = self.client.metrics().await;
        let from_proc = self.pid().and_then(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| parse_vm_rss(&s))
        });
        let from_metrics =
            metrics.as_deref().and_then(|m| metric_value(m, RSS_METRIC)).map(|b| b as u64);
        Footprint {
            rss_bytes: from_proc.or(from_metrics),
            kv_usage: metrics.as_deref().and_then(|m| metric_value(m, KV_METRIC)),
        }
    }

    /// Samples every `every` until [`Sampler::stop`], keeping the peak.
    pub fn start(&self, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (probe, flag) = (self.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut peak = Footprint::default();
            while !flag.load(Ordering::Relaxed) {
                peak = peak.peak(probe.sample().await);
                tokio::time::sleep(every).await;
            }
            peak
        });
        Sampler { stop, task }
    }
}

/// A running [`Probe::start`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Footprint>,
}

impl Sampler {
    /// The peak footprint seen.
    pub async fn stop(self) -> Footprint {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Every gate and footprint figure of a benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Gates {
    pub early_stop: EarlyStop,
    pub memory_source: String,
    /// Before the first measured call.
    pub idle: Footprint,
    /// The peak while the panel ran.
    pub under_load: Footprint,
    /// Cores other processes kept busy in a second before the benchmark.
    pub foreign_cores_before: Option<f64>,
    /// ... and while it ran (only when the server's own time is known: started here).
    pub foreign_cores_during: Option<f64>,
}

impl Gates {
    /// Cores another busy process kept busy, when enough to warn about.
    pub fn foreign_load(&self) -> Option<f64> {
        let worst = self
            .foreign_cores_before
            .into_iter()
            .chain(self.foreign_cores_during)
            .fold(0.0, f64::max);
        (worst >= FOREIGN_CORES_WARNING).then_some(worst)
    }
}

/// How long the machine is watched before the benchmark for another busy process.
pub const IDLE_WATCH: Duration = Duration::from_secs(1);
/// How often the footprint is sampled while the benchmark runs.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Watches the machine and the server from before the first measured call to after the last.
pub struct GateWatch {
    probe: Probe,
    idle: Footprint,
    foreign_cores_before: Option<f64>,
    cpu_start: Option<CpuSample>,
    sampler: Sampler,
}

impl GateWatch {
    /// Watches the idle machine for `idle_watch`, samples the idle server, and starts sampling.
    pub async fn begin(probe: Probe, idle_watch: Duration) -> Self {
        let before = CpuSample::now(probe.pid());
        tokio::time::sleep(idle_watch).await;
        let after = CpuSample::now(probe.pid());
        let foreign_cores_before = before.zip(after).map(|(b, a)| b.foreign_cores(&a));
        let idle = probe.sample().await;
        let sampler = probe.start(SAMPLE_EVERY);
        let cpu_start = CpuSample::now(probe.pid());
        Self { probe, idle, foreign_cores_before, cpu_start, sampler }
    }

    /// The gates, with `completions` the completion tokens of every measured call.
    pub async fn end(self, completions: &[u32]) -> Gates {
        let last = self.probe.sample().await;
        let under_load = self.sampler.stop().await.peak(last);
        let pid = self.probe.pid();
        // Without the server's process, its work would count as another process's.
        let foreign_cores_during = pid
            .and(self.cpu_start)
            .zip(CpuSample::now(pid))
            .map(|(start, end)| start.foreign_cores(&end));
        Gates {
            early_stop: EarlyStop::of(completions),
            memory_source: self.probe.memory_source().to_string(),
            idle: self.idle,
            under_load,
            foreign_cores_before: self.foreign_cores_before,
            foreign_cores_during,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_stop_needs_two_runs_under_half_the_median() {
        let one = EarlyStop::of(&[16, 16, 16, 7, 16]);
        assert_eq!((one.short, one.median_completion, one.tripped()), (1, 16.0, false));
        let two = EarlyStop::of(&[16, 16, 16, 7, 3, 16]);
        assert_eq!((two.short, two.tripped()), (2, true));
        // Exactly half is not short.
        assert!(!EarlyStop::of(&[16, 8, 8, 16, 16]).tripped());
        assert!(!EarlyStop::of(&[]).tripped());
    }

    #[test]
    fn rss_from_proc_status() {
        let status = "Name:\tspindle\nVmPeak:\t  900 kB\nVmRSS:\t  524288 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(status), Some(512 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn metric_values_with_and_without_labels() {
        let text = "# HELP process_resident_memory_bytes Resident memory\n\
                    # TYPE process_resident_memory_bytes gauge\n\
                    process_resident_memory_bytes 1.5e9\n\
                    process_resident_memory_bytes_total 7\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n";
        assert_eq!(metric_value(text, RSS_METRIC), Some(1.5e9));
        assert_eq!(metric_value(text, KV_METRIC), Some(0.25));
        assert_eq!(metric_value(text, "vllm:num_requests_running"), None);
        assert_eq!(metric_value("vllm:kv_cache_usage_perc 0.5", KV_METRIC), Some(0.5));
    }

    #[test]
    fn proc_stat_parsing() {
        let stat = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n";
        assert_eq!(parse_cpu_line(stat), Some((980, 160)));
        let pid = "4242 (spin dle) S 1 4242 4242 0 -1 4194304 100 0 0 0 70 30 5 1 20 0 4 0";
        assert_eq!(parse_pid_ticks(pid), Some(106));
        assert_eq!(parse_pid_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 70 30"), None);
    }

    #[test]
    fn foreign_cores_are_busy_ticks_not_ours() {
        let before = CpuSample { total: 0, busy: 0, own: 0, cpus: 2 };
        // 1 s on 2 CPUs (200 ticks): 150 busy, 50 of them ours -> 1 core of someone else's.
        let after = CpuSample { total: 200, busy: 150, own: 50, cpus: 2 };
        assert_eq!(before.foreign_cores(&after), 1.0);
        let ours = CpuSample { own: 150, ..after };
        assert_eq!(before.foreign_cores(&ours), 0.0);
        assert_eq!(after.foreign_cores(&after), 0.0);
    }

    #[test]
    fn gates_warn_on_the_worse_foreign_load() {
        let footprint = Footprint::default();
        let mut gates = Gates {
            early_stop: EarlyStop::of(&[16]),
            memory_source: String::new(),
            idle: footprint,
            under_load: footprint,
            foreign_cores_before: Some(0.1),
            foreign_cores_during: None,
        };
        assert_eq!(gates.foreign_load(), None);
        gates.foreign_cores_during = Some(1.2);
        assert_eq!(gates.foreign_load(), Some(1.2));
    }

    #[test]
    fn peaks_keep_the_larger_figure() {
        let a = Footprint { rss_bytes: Some(10), kv_usage: None };
        let b = Footprint { rss_bytes: Some(5), kv_usage: Some(0.3) };
        assert_eq!(a.peak(b), Footprint { rss_bytes: Some(10), kv_usage: Some(0.3) });
    }
}
