//! CPU time of a process tree, from `/proc`: what PostgreSQL and maasd
//! spend per request. Unlike a rate, CPU seconds per request hardly move
//! when another program shares the cores, so a change's cost shows even on
//! a busy machine (the rates still need a quiet one).

use std::path::Path;

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// utime, stime, cutime and cstime of `pid` (fields 14–17), and its parent.
fn times(pid: u32) -> Option<(u32, [u64; 4])> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let parent = fields.get(1)?.parse().ok()?;
    let t = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some((parent, [t(11)?, t(12)?, t(13)?, t(14)?]))
}

/// Seconds of CPU spent by `root` and its children, living or reaped
/// (a reaped child's time is in its parent's cutime/cstime).
pub fn seconds(root: u32) -> f64 {
    let Some((_, own)) = times(root) else {
        return 0.0;
    };
    let mut ticks = own.iter().sum::<u64>();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((parent, t)) = times(pid)
                && parent == root
            {
                ticks += t[0] + t[1];
            }
        }
    }
    ticks as f64 / TICKS
}

/// The postmaster's pid of a cluster (the first line of postmaster.pid).
pub fn postmaster(data_dir: &Path) -> u32 {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap_or_default();
    text.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0)
}
