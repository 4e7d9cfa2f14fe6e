//! The Valkey quota store.
//!
//! The hot path is plain commands in one pipelined round trip (`INCR`,
//! `EXPIREAT … NX`, `SET …:ts NX EXAT`, `EXPIRETIME`, `EXPIREAT …:grant …
//! NX` and `GET …:grant`: the extra scans support granted, which cost
//! Valkey about two more cheap commands and no round trip; the `EXPIREAT`
//! gives a grant made before the period's first scan, which has no expiry,
//! the counter's, see [`QuotaKey::grant`]): a server-side script
//! would cost Valkey some 40 INCRs per scan. Scripts (sent whole with
//! `EVAL`, see [`crate::connection::eval`]) run only where a
//! decision must be atomic and the request is off the hot path anyway: a
//! keyed scan's claim (`claim.lua`), pacing an over-quota scan (`pace.lua`),
//! a refund after a failure (`refund.lua`), freeing an abandoned attempt's
//! lease (`release.lua`) and taking over an abandoned record
//! (`take_over.lua`). Every key of a subject shares its hash tag, so
//! each call is single-slot in cluster mode.
//!
//! Operator reads and writes (`inspect`, `reset`, `purge`) live with the
//! operators, in [`crate::ops::keys`].

use redis::Value;
use uuid::Uuid;

use crate::unix::{UnixMillis, UnixSecs};

use super::key::{IDEMPOTENCY_TTL_SECS, QuotaKey};
use super::quota_store::{
    CountArgs, PaceArgs, QuotaStore, RecordUpdate, Refund, StoreError, TakeOver,
};
use crate::connection::{Request, Valkey, sized_cmd};
use crate::pace::Paced;
use crate::record::{Claim, Claimed, Count, Peek, Record};

const CLAIM: &str = include_str!("claim.lua");
const PACE: &str = include_str!("pace.lua");
const REFUND: &str = include_str!("refund.lua");
const RELEASE: &str = include_str!("release.lua");
const TAKE_OVER: &str = include_str!("take_over.lua");

/// Every script that reads or writes an idempotency record, for the test
/// that checks they spell the record's fields as [`crate::record::RecordField`] does.
pub const RECORD_SCRIPTS: [(&str, &str); 5] = [
    ("claim.lua", CLAIM),
    ("pace.lua", PACE),
    ("refund.lua", REFUND),
    ("release.lua", RELEASE),
    ("take_over.lua", TAKE_OVER),
];

/// Scripts are sent with [`crate::connection::eval`]; the operator tools and
/// the consumer's markers still name it here.
pub(crate) use crate::connection::eval;

/// A quota store on Valkey.
#[derive(Clone)]
pub struct ValkeyStore {
    valkey: Valkey,
    /// `VALKEY_WAIT_REPLICAS` (0: off).
    wait_replicas: u32,
}

fn iso8601(at: UnixSecs) -> String {
    crate::clock::rfc3339(at.get())
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

fn text(v: &Value) -> &str {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).unwrap_or_default(),
        Value::SimpleString(s) => s,
        _ => "",
    }
}

fn unexpected(what: &str) -> StoreError {
    StoreError::Backend(format!("unexpected reply to {what}"))
}

impl ValkeyStore {
    pub fn new(valkey: Valkey) -> Self {
        Self {
            valkey,
            wait_replicas: 0,
        }
    }

    /// A keyed claim waits (`WAIT`) until `replicas` replicas have it before
    /// its scan goes on; one that does not get there in time is a count
    /// whose fate is unknown (it may be lost in a failover), settled as one.
    pub fn with_wait(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// `WAIT`s for the claim just sent to reach the replicas, on the same
    /// connection (so behind it), within half the store timeout.
    async fn replicated(&self) -> Result<(), StoreError> {
        let cmd = crate::connection::wait(self.wait_replicas, self.valkey.timeout());
        let reached: u32 = self.send(cmd).await?;
        if reached < self.wait_replicas {
            return Err(StoreError::Unanswered);
        }
        Ok(())
    }

    pub fn valkey(&self) -> &Valkey {
        &self.valkey
    }

    /// Sends one request of the request path, bounded by the store timeout.
    async fn send<T: redis::FromRedisValue>(
        &self,
        request: impl Into<Request>,
    ) -> Result<T, StoreError> {
        Ok(self.valkey.send(request, self.valkey.timeout()).await?)
    }
}

impl QuotaStore for ValkeyStore {
    fn warm_up(&self) {
        self.valkey.warm_up();
    }

    /// Each command is sent by [`Valkey::send`] within the store timeout.
    fn bounds_itself(&self) -> bool {
        true
    }

    async fn count(&self, args: CountArgs<'_>) -> Result<Count, StoreError> {
        let key = args.key;
        // Each command sized at once (numbers and words: 48 bytes of room).
        let sized = |name, args, key: &str| sized_cmd(name, args, key.len() + 48);
        let mut pipe = redis::Pipeline::with_capacity(6);
        // `EXPIREAT <key> <period end> NX`: an expiry only where there is none.
        let expire_nx = |pipe: &mut redis::Pipeline, key: &str| {
            pipe.add_command(sized("EXPIREAT", 4, key))
                .arg(key)
                .arg(args.period_end.get())
                .arg("NX")
                .ignore();
        };
        // Plain `INCR`, not `INCRBY 1` (which `pipe().incr` sends): one
        // argument less to parse, measurably cheaper for Valkey.
        pipe.add_command(sized("INCR", 2, &key.counter))
            .arg(&key.counter);
        expire_nx(&mut pipe, &key.counter);
        pipe.add_command(sized("SET", 7, &key.first_seen))
            .arg(&key.first_seen)
            .arg(iso8601(args.now))
            .arg("EXAT")
            .arg(args.period_end.get())
            .arg("NX")
            .ignore()
            .add_command(sized("EXPIRETIME", 2, &key.counter))
            .arg(&key.counter);
        // A grant without expiry was made before this period's first scan:
        // it ends with the period this count is in (a grant made while the
        // counter lived has its expiry already; the one this count opened
        // is `period_end`).
        expire_nx(&mut pipe, &key.grant);
        pipe.add_command(sized("GET", 2, &key.grant))
            .arg(&key.grant);
        let (used, reset_at, grant): (u64, i64, Option<u64>) = self.send(pipe).await?;
        Ok(Count {
            used,
            reset_at: UnixSecs(reset_at),
            now: args.now,
            grant: grant.unwrap_or(0),
        })
    }

    async fn peek(&self, key: &QuotaKey, _now: UnixSecs) -> Result<Peek, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(&key.counter)
            .cmd("EXPIRETIME")
            .arg(&key.counter)
            .cmd("GET")
            .arg(&key.slot)
            .cmd("GET")
            .arg(&key.grant);
        let (used, reset_at, slot_ms, grant): (Option<u64>, i64, Option<i64>, Option<u64>) =
            self.send(pipe).await?;
        Ok(Peek {
            used: used.unwrap_or(0),
            // -1: no expiry; -2: no counter.
            reset_at: used.and(Some(reset_at)).filter(|at| *at >= 0).map(UnixSecs),
            slot_ms: slot_ms.map(UnixMillis),
            grant: grant.unwrap_or(0),
        })
    }

    async fn count_keyed(&self, args: CountArgs<'_>, claim: &Claim) -> Result<Claimed, StoreError> {
        let key = args.key;
        let mut cmd = eval(
            CLAIM,
            &[&key.counter, &key.first_seen, &claim.record, &key.grant],
        );
        cmd.arg(args.period_end.get())
            .arg(iso8601(args.now))
            .arg(claim.scan_id.to_string())
            .arg(&claim.fingerprint)
            .arg(claim.received_ms.get())
            .arg(claim.lease_until_ms.get())
            .arg(IDEMPOTENCY_TTL_SECS);
        let reply: Vec<Value> = self.send(cmd).await?;
        match reply.as_slice() {
            [Value::Int(0), Value::Array(fields)] => {
                let pairs = fields.chunks_exact(2).map(|p| (text(&p[0]), text(&p[1])));
                Ok(Claimed::Existing(Record::from_pairs(pairs)?))
            }
            [used, reset_at, grant] => {
                let count = Count {
                    used: u64::try_from(int(used)).map_err(|_| unexpected("claim"))?,
                    reset_at: UnixSecs(int(reset_at)),
                    now: args.now,
                    grant: u64::try_from(int(grant)).unwrap_or(0),
                };
                if self.wait_replicas > 0 {
                    self.replicated().await?;
                }
                Ok(Claimed::New(count))
            }
            _ => Err(unexpected("claim")),
        }
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, StoreError> {
        let mut keys = vec![args.key.slot.as_str()];
        keys.extend(args.record);
        let mut cmd = eval(PACE, &keys);
        cmd.arg(args.arrival_ms.get())
            .arg(args.delay_ms)
            .arg(args.max_backlog_ms)
            .arg(args.reset_at.get());
        let (fits, ms): (i64, i64) = self.send(cmd).await?;
        let ms = u64::try_from(ms).unwrap_or(0);
        Ok(if fits == 1 {
            Paced::Slot { delay_ms: ms }
        } else {
            Paced::Full { retry_after_ms: ms }
        })
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let mut keys = vec![refund.key.counter.as_str()];
        keys.extend(refund.record.map(|(r, _)| r));
        let mut cmd = eval(REFUND, &keys);
        cmd.arg(refund.period_end.get()).arg(
            refund
                .record
                .map(|(_, id)| id.to_string())
                .unwrap_or_default(),
        );
        let _: i64 = self.send(cmd).await?;
        Ok(())
    }

    async fn release(&self, record: &str, scan_id: Uuid, _now: UnixSecs) -> Result<(), StoreError> {
        let mut cmd = eval(RELEASE, &[record]);
        cmd.arg(scan_id.to_string());
        let _: i64 = self.send(cmd).await?;
        Ok(())
    }

    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), StoreError> {
        let RecordUpdate { record, fields, .. } = update;
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(record);
        for (field, value) in fields {
            pipe.arg(field.name()).arg(value);
        }
        pipe.ignore()
            .cmd("EXPIRE")
            .arg(record)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg("NX")
            .ignore();
        let () = self.send(pipe).await?;
        Ok(())
    }

    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, StoreError> {
        let mut cmd = eval(TAKE_OVER, &[args.record]);
        cmd.arg(args.expected_until_ms.get())
            .arg(args.lease_until_ms.get());
        let taken: i64 = self.send(cmd).await?;
        Ok(taken == 1)
    }
}
