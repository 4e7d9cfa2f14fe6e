//! The guarantees, checked after every schedule against what landed: the
//! answers the gate gave (whether or not the client was still there), the
//! jobs in the queue, and the store's ledger of counts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::num::NonZeroU32;

use bytes::Bytes;
use http::Response;
use quota_gate::config::Config;
use quota_gate::io::queue::ScanJob;
use quota_gate::rules::decide::decide;

use super::store::Ledger;

/// One answer the gate gave.
#[derive(Debug, Clone)]
pub struct Answer {
    pub group: usize,
    pub attempt: usize,
    pub at_ms: i64,
    pub status: u16,
    pub body: serde_json::Value,
    pub unmetered: bool,
    pub replayed: bool,
    /// The gate's store had answered it since the faults ended (and so
    /// its breaker, if it had opened, had closed again) when this came.
    pub store_answering: bool,
}

impl Answer {
    pub fn new(
        group: usize,
        attempt: usize,
        at_ms: i64,
        store_answering: bool,
        response: &Response<Bytes>,
    ) -> Self {
        let (status, body, unmetered, replayed) = super::answer_of(response);
        Self {
            group,
            attempt,
            at_ms,
            status,
            body,
            unmetered,
            replayed,
            store_answering,
        }
    }

    fn scan_id(&self) -> Option<&str> {
        self.body["scanId"].as_str()
    }

    /// A 503 that said the outcome is not known.
    fn unknown(&self) -> bool {
        self.body["queued"] == "unknown" || self.body["counted"] == "unknown"
    }
}

/// One scan a client wanted.
#[derive(Debug, Clone)]
pub struct Group {
    pub keyed: bool,
    /// A token holder: its subject is its `tid`, its levels the token
    /// levels of its address's networks.
    pub token: bool,
    /// The client's address: its subject, and the levels above it.
    pub ip: &'static str,
    pub body: String,
    /// Unix ms of its first attempt.
    pub first_ms: i64,
}

impl Group {
    /// How the events name its client: its address, and its token if any.
    fn label(&self) -> String {
        match self.token {
            true => format!("{} with a token", self.ip),
            false => self.ip.to_owned(),
        }
    }
}

/// Everything a schedule left.
pub struct World {
    pub(crate) config: Config,
    pub(crate) groups: Vec<Group>,
    pub(crate) answers: Vec<Answer>,
    pub(crate) jobs: Vec<ScanJob>,
    pub(crate) ledger: Ledger,
    /// From here on the store answers every command (unix ms).
    pub(crate) faults_over_ms: i64,
}

impl World {
    /// Every guarantee; the first broken one, with the events, as `Err`.
    pub fn check(&self) -> Result<(), String> {
        let broken = self.broken();
        if broken.is_empty() {
            return Ok(());
        }
        let mut report = broken.join("\n");
        report.push_str("\n--- events ---\n");
        report.push_str(&self.events());
        Err(report)
    }

    fn broken(&self) -> Vec<String> {
        let mut broken = Vec::new();
        let jobs = self.jobs_by_group(&mut broken);
        for (g, group) in self.groups.iter().enumerate() {
            let answers: Vec<_> = self.answers.iter().filter(|a| a.group == g).collect();
            let jobs = jobs.get(&g).map_or(&[][..], Vec::as_slice);
            if let Err(e) = self.check_group(g, group, &answers, jobs) {
                broken.push(format!("scan {g}: {e}"));
            }
        }
        for job in &self.jobs {
            if let Err(e) = self.check_not_before(job) {
                broken.push(format!("job {}: {e}", job.scan_id));
            }
        }
        if let Err(e) = self.check_counter(&jobs) {
            broken.push(e);
        }
        broken.extend(self.check_levels(&jobs));
        for a in &self.answers {
            // A scan first tried once the faults were over, at a gate
            // whose store has answered since (its breaker closed again).
            let fresh = self.groups[a.group].first_ms >= self.faults_over_ms && a.store_answering;
            if a.status == 202 && a.unmetered && !a.replayed && fresh {
                broken.push(format!(
                    "scan {}: answered unmetered at {} ms, after the store answered again",
                    a.group,
                    a.at_ms - super::T0_MS
                ));
            }
        }
        broken
    }

    fn jobs_by_group(&self, broken: &mut Vec<String>) -> HashMap<usize, Vec<&ScanJob>> {
        let mut by_group: HashMap<usize, Vec<&ScanJob>> = HashMap::new();
        for job in &self.jobs {
            let image = job.image();
            match image
                .as_deref()
                .and_then(|i| i.rsplit(':').next())
                .and_then(|g| g.parse().ok())
            {
                Some(g) => by_group.entry(g).or_default().push(job),
                None => broken.push(format!("job {} names no scan", job.scan_id)),
            }
        }
        by_group
    }

    fn check_group(
        &self,
        g: usize,
        group: &Group,
        answers: &[&Answer],
        jobs: &[&ScanJob],
    ) -> Result<(), String> {
        let accepted: Vec<_> = answers.iter().filter(|a| a.status == 202).collect();
        let unknown = answers.iter().any(|a| a.unknown());
        if jobs.len() > 1 {
            return Err(format!("{} jobs", jobs.len()));
        }
        if let Some(first) = accepted.first() {
            let id = first.scan_id().ok_or("a 202 without a scanId")?;
            if let Some(other) = accepted.iter().find(|a| a.scan_id() != Some(id)) {
                return Err(format!(
                    "202s under two scanIds: {id} and {:?}",
                    other.scan_id()
                ));
            }
            match jobs {
                [job] if job.scan_id.to_string() == id => {}
                [job] => return Err(format!("the 202 said {id}, the job is {}", job.scan_id)),
                _ => return Err(format!("a 202 ({id}) without its job")),
            }
        } else if !jobs.is_empty() && !unknown {
            return Err("a job without a 202, and no answer said \"unknown\"".into());
        }
        if !group.keyed && answers.iter().any(|a| a.body["queued"] == false) && !jobs.is_empty() {
            return Err("\"queued\": false, and a job".into());
        }
        if group.keyed {
            self.check_keyed_count(g, group, jobs, !accepted.is_empty(), unknown)?;
        }
        Ok(())
    }

    /// A keyed scan is counted once if its job is, and not at all if its
    /// job runs unmetered (unless an attempt said "unknown"); without a 202
    /// a count may stand only behind an "unknown" (or a refund that never
    /// arrived).
    fn check_keyed_count(
        &self,
        g: usize,
        group: &Group,
        jobs: &[&ScanJob],
        accepted: bool,
        unknown: bool,
    ) -> Result<(), String> {
        let tag = Some(self.record_of(group).unwrap_or_default());
        let net = self.ledger.net.get(&tag).copied().unwrap_or(0);
        let lost = self.ledger.lost_refunds.get(&tag).copied().unwrap_or(0);
        let counted_job = jobs.first().is_some_and(|j| j.count > 0);
        if accepted || counted_job {
            // A count behind an "unknown" may stand even so: a retry that
            // could not reach the store runs the scan unmetered.
            // And a refund behind an unkeyed count that never ran takes a
            // count of the subject: when it is this one's, this one's own
            // refund finds the counter short.
            let want = i64::from(counted_job);
            let stolen = self.ledger.counts_lost;
            let allowed = want + i64::from(unknown && !counted_job) + lost + stolen;
            if net < want || net > allowed {
                return Err(format!(
                    "counted {net} times, its job says {}",
                    if counted_job { "counted" } else { "unmetered" }
                ));
            }
        } else if net < 0
            || net > 1 + self.ledger.counts_lost
            || (net >= 1 && !unknown && lost == 0 && self.ledger.counts_lost == 0)
        {
            return Err(format!(
                "counted {net} times without a job (scan {g} said unknown: {unknown})"
            ));
        }
        Ok(())
    }

    /// A keyed scan's record, found by its body's fingerprint.
    fn record_of(&self, group: &Group) -> Option<String> {
        let fingerprint = quota_gate::gate::idempotency::fingerprint(group.body.as_bytes());
        self.ledger
            .fingerprints
            .iter()
            .find(|(_, f)| **f == fingerprint)
            .map(|(r, _)| r.clone())
    }

    /// No job may start before its count's delay, counted from its arrival;
    /// a keyed job carries its landed claim's count and arrival.
    fn check_not_before(&self, job: &ScanJob) -> Result<(), String> {
        let received = crate::unix_ms(&job.received_at);
        if job.count == 0 {
            return Ok(());
        }
        let claim = self.ledger.claims.iter().find(|c| c.scan_id == job.scan_id);
        if let Some(claim) = claim
            && (claim.used != job.count || claim.received_ms.get() != received)
        {
            return Err(format!(
                "carries count {} from {received}, its claim landed {} from {}",
                job.count,
                claim.used,
                claim.received_ms.get()
            ));
        }
        let limit = NonZeroU32::new(job.limit).ok_or("limit 0")?;
        let owed = decide(job.count, &self.config.policy.limits(limit)).delay;
        let earliest = received + owed.as_millis() as i64;
        if job.not_before_ms < earliest {
            return Err(format!(
                "notBefore {} ms before its count's delay ({} ms)",
                earliest - job.not_before_ms,
                owed.as_millis()
            ));
        }
        Ok(())
    }

    /// The unkeyed counts: what was counted, within the "unknown" answers,
    /// the refunds that never arrived, and the refunds sent behind a count
    /// that never ran (sent, unanswered, lost with its connection).
    fn check_counter(&self, jobs: &HashMap<usize, Vec<&ScanJob>>) -> Result<(), String> {
        let (mut counted, mut unknown) = (0i64, 0i64);
        for (g, group) in self.groups.iter().enumerate() {
            if group.keyed {
                continue;
            }
            let group_jobs = jobs
                .get(&g)
                .map_or(0, |j| j.iter().filter(|j| j.count > 0).count());
            counted += group_jobs as i64;
            if self.answers.iter().any(|a| a.group == g && a.unknown()) {
                unknown += 1;
            }
        }
        let net = self.ledger.net.get(&None).copied().unwrap_or(0);
        let lost = self.ledger.lost_refunds.get(&None).copied().unwrap_or(0);
        let never_ran = self.ledger.counts_lost;
        if net < counted - unknown - never_ran || net > counted + unknown + lost {
            return Err(format!(
                "unkeyed: the counter grew {net}, for {counted} counted jobs, {unknown} \
                 \"unknown\" answers, {lost} refunds lost and {never_ran} counts that never ran"
            ));
        }
        Ok(())
    }

    /// Each level's counter, checked as the unkeyed subjects' is: it grew by
    /// the scans of its addresses that were queued counted, keyed or not
    /// (a refused scan is counted at no level, a replayed one never again),
    /// except for the same allowances: an "unknown" answer (±1), a level
    /// refund that never arrived (+1), and a level refund sent behind a
    /// count that never ran (−1). A level's refund names no record, so the
    /// check is per level, over all the scans of its addresses.
    fn check_levels(&self, jobs: &HashMap<usize, Vec<&ScanJob>>) -> Vec<String> {
        let identifier =
            quota_gate::gate::identity::Identifier::new(&self.config).expect("the sim's config");
        // Each level's counter key, and its scans: counted and "unknown".
        let mut levels: Vec<(String, i64, i64)> = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            let ip = group.ip.parse().expect("a sim address");
            let counted = jobs.get(&g).is_some_and(|j| j.iter().any(|j| j.count > 0));
            let unknown = self.answers.iter().any(|a| a.group == g && a.unknown());
            let scope = match group.token {
                true => quota_gate::rules::scope::Scope::Tid,
                false => quota_gate::rules::scope::Scope::Ip,
            };
            for level in identifier.levels_of(scope, ip) {
                let counter = level.key.counter;
                let i = match levels.iter().position(|(c, ..)| *c == counter) {
                    Some(i) => i,
                    None => {
                        levels.push((counter, 0, 0));
                        levels.len() - 1
                    }
                };
                levels[i].1 += i64::from(counted);
                levels[i].2 += i64::from(unknown);
            }
        }
        let ledger = &self.ledger;
        let mut broken = Vec::new();
        for (counter, counted, unknown) in levels {
            let net = ledger.by_key.get(&counter).copied().unwrap_or(0);
            let lost = ledger
                .level_refunds_lost
                .get(&counter)
                .copied()
                .unwrap_or(0);
            let never_ran = ledger.level_counts_lost.get(&counter).copied().unwrap_or(0);
            let short = unknown + never_ran;
            if net < counted - short || net > counted + unknown + lost {
                broken.push(format!(
                    "level {counter}: the counter grew {net}, for {counted} counted jobs, \
                     {unknown} \"unknown\" answers, {lost} refunds lost and {never_ran} \
                     counts that never ran"
                ));
            }
        }
        broken
    }

    /// The schedule's answers, jobs and counts, for a failure's report.
    pub fn events(&self) -> String {
        let mut out = String::new();
        let mut answers: Vec<_> = self.answers.iter().collect();
        answers.sort_by_key(|a| a.at_ms);
        for a in answers {
            let b = &a.body;
            let _ = writeln!(
                out,
                "t={:>6} ms  scan {} ({}) attempt {}: {} {} scanId={} used={} level={} queued={} counted={}{}{}",
                a.at_ms - super::T0_MS,
                a.group,
                self.groups[a.group].label(),
                a.attempt,
                a.status,
                b["error"].as_str().unwrap_or(""),
                b["scanId"].as_str().unwrap_or("-"),
                b["quota"]["used"],
                b["quota"]["level"],
                b["queued"],
                b["counted"],
                if a.unmetered { " unmetered" } else { "" },
                if a.replayed { " replayed" } else { "" },
            );
        }
        for job in &self.jobs {
            let _ = writeln!(
                out,
                "job {} {} count={} tier={} delay={} ms notBefore-received={} ms",
                job.image().as_deref().unwrap_or("?"),
                job.scan_id,
                job.count,
                job.tier,
                job.delay_ms,
                job.not_before_ms - crate::unix_ms(&job.received_at),
            );
        }
        let _ = writeln!(out, "counts by record: {:?}", self.ledger.net);
        let _ = writeln!(out, "refunds lost: {:?}", self.ledger.lost_refunds);
        let _ = writeln!(out, "counts by key: {:?}", self.ledger.by_key);
        let _ = writeln!(
            out,
            "level refunds lost: {:?}; level counts that never ran: {:?}",
            self.ledger.level_refunds_lost, self.ledger.level_counts_lost
        );
        out
    }
}
