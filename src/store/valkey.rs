//! The Valkey quota store.
//!
//! The hot path is plain commands in one pipelined round trip (`INCR`,
//! `EXPIREAT … NX`, `SET …:ts NX EXAT`, `EXPIRETIME`): a server-side script
//! would cost Valkey some 40 INCRs per scan. Scripts (sent whole with
//! `EVAL`, see `eval`) run only where a
//! decision must be atomic and the request is off the hot path anyway: a
//! keyed scan's claim (`claim.lua`), pacing an over-quota scan (`pace.lua`),
//! a refund after a failure (`refund.lua`) and taking over an abandoned
//! record (`take_over.lua`). Every key of a subject shares its hash tag, so
//! each call is single-slot in cluster mode.
//!
//! Operator reads and writes (`inspect`, `reset`, `purge`) live with the
//! operators, in [`crate::ops::keys`].

use redis::Value;

use super::{
    Claim, Claimed, Count, CountArgs, Field, IDEMPOTENCY_TTL_SECS, PaceArgs, Paced, QuotaStore,
    Record, Refund, StoreError,
};
use crate::valkey::{Connection, Valkey};

const CLAIM: &str = include_str!("claim.lua");
const PACE: &str = include_str!("pace.lua");
const REFUND: &str = include_str!("refund.lua");
const TAKE_OVER: &str = include_str!("take_over.lua");

/// Frees a record's lease, if the record exists.
const RELEASE: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then \
    redis.call('HSET', KEYS[1], 'until', '0') end";

/// `EVAL <script> <keys>`: the whole script in one command, which Valkey
/// compiles once and caches. Not `EVALSHA` with a fallback to `EVAL` on
/// `NOSCRIPT`: that is two commands, and a caller that times out after the
/// first never sends the second. A late claim would then never land while
/// the refund sent after it would, taking back a count that was never made.
/// One command each keeps "sent" meaning "will run, in order".
pub(crate) fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// A quota store on Valkey.
#[derive(Clone)]
pub struct ValkeyStore {
    valkey: Valkey,
}

fn iso8601(secs: i64) -> String {
    crate::respond::rfc3339(secs)
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
        Self { valkey }
    }

    pub fn valkey(&self) -> &Valkey {
        &self.valkey
    }

    async fn connection(&self) -> Result<Connection, StoreError> {
        Ok(self.valkey.connection().await?)
    }
}

impl QuotaStore for ValkeyStore {
    async fn count(&self, args: CountArgs<'_>) -> Result<Count, StoreError> {
        let key = args.key;
        let mut conn = self.connection().await?;
        // Plain `INCR`, not `INCRBY 1` (which `pipe().incr` sends): one
        // argument less to parse, measurably cheaper for Valkey.
        let (used, reset_at): (u64, i64) = redis::pipe()
            .cmd("INCR")
            .arg(&key.counter)
            .cmd("EXPIREAT")
            .arg(&key.counter)
            .arg(args.period_end)
            .arg("NX")
            .ignore()
            .cmd("SET")
            .arg(&key.first_seen)
            .arg(iso8601(args.now))
            .arg("EXAT")
            .arg(args.period_end)
            .arg("NX")
            .ignore()
            .cmd("EXPIRETIME")
            .arg(&key.counter)
            .query_async(&mut conn)
            .await?;
        Ok(Count {
            used,
            reset_at,
            now: args.now,
        })
    }

    async fn count_keyed(&self, args: CountArgs<'_>, claim: &Claim) -> Result<Claimed, StoreError> {
        let key = args.key;
        let mut conn = self.connection().await?;
        let reply: Vec<Value> = eval(CLAIM, &[&key.counter, &key.first_seen, &claim.record])
            .arg(args.period_end)
            .arg(iso8601(args.now))
            .arg(&claim.scan_id)
            .arg(&claim.fingerprint)
            .arg(claim.received_ms)
            .arg(claim.lease_until_ms)
            .arg(IDEMPOTENCY_TTL_SECS)
            .query_async(&mut conn)
            .await?;
        match reply.as_slice() {
            [Value::Int(0), Value::Array(fields)] => {
                let pairs = fields.chunks_exact(2).map(|p| (text(&p[0]), text(&p[1])));
                Ok(Claimed::Existing(Record::from_pairs(pairs)))
            }
            [used, reset_at] => Ok(Claimed::New(Count {
                used: u64::try_from(int(used)).map_err(|_| unexpected("claim"))?,
                reset_at: int(reset_at),
                now: args.now,
            })),
            _ => Err(unexpected("claim")),
        }
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, StoreError> {
        let mut conn = self.connection().await?;
        let mut keys = vec![args.key.slot.as_str()];
        keys.extend(args.record);
        let (fits, ms): (i64, i64) = eval(PACE, &keys)
            .arg(args.arrival_ms)
            .arg(args.delay_ms)
            .arg(args.max_backlog_ms)
            .arg(args.reset_at)
            .query_async(&mut conn)
            .await?;
        let ms = u64::try_from(ms).unwrap_or(0);
        Ok(if fits == 1 {
            Paced::Slot { delay_ms: ms }
        } else {
            Paced::Full { retry_after_ms: ms }
        })
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let mut keys = vec![refund.key.counter.as_str()];
        keys.extend(refund.record.map(|(r, _)| r));
        let _: i64 = eval(REFUND, &keys)
            .arg(refund.period_end)
            .arg(refund.record.map_or("", |(_, scan_id)| scan_id))
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn release(&self, record: &str) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let () = eval(RELEASE, &[record]).query_async(&mut conn).await?;
        Ok(())
    }

    async fn update_record(&self, record: &str, fields: &[Field]) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(record);
        for (field, value) in fields {
            pipe.arg(*field).arg(value);
        }
        pipe.ignore()
            .cmd("EXPIRE")
            .arg(record)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg("NX")
            .ignore();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    async fn take_over(&self, record: &str, seen: i64, until: i64) -> Result<bool, StoreError> {
        let mut conn = self.connection().await?;
        let taken: i64 = eval(TAKE_OVER, &[record])
            .arg(seen)
            .arg(until)
            .query_async(&mut conn)
            .await?;
        Ok(taken == 1)
    }
}
