//! Probes of the machine: RAM, cgroup limits, disks.
