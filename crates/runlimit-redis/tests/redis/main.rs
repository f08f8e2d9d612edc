//! runlimit-redis' integration tests but the conformance suite, one binary: capacity bounds,
//! Redis Cluster, connections (TLS, ACL users, Unix sockets), the Lua scripts against the core
//! rules, fault injection, replicas and Sentinel, each against real `redis-server` processes.

mod support;

mod capacity;
mod cluster;
mod connections;
mod differential;
mod faults;
mod replicas;
mod sentinel;
