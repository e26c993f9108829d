//! The messages of a run and the order they are delivered in: every distinct payment 1 to
//! 4 times, shuffled; hostile text in every text field; bad inputs among them; and the
//! payments that the fault injectors deliver themselves (lock-order pairs, slow bodies,
//! leases that run out).

use crate::ledger::{Behaviour, Payment};
use crate::seeded_random::SeededRandom;

/// Which handler a message is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// [`apply_payment`](crate::ledger::apply_payment), one by one or in batches.
    Ledger,
    /// [`notify_payment`](crate::ledger::notify_payment), lease mode.
    External,
    /// [`record_receipt`](crate::ledger::record_receipt), raced by the retention cleanup.
    Receipt,
}

/// Why a message is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The payload is not a payment.
    Undecodable,
    /// The payment has no `payment_id` (missing or `null`): `Error::Key`.
    MissingKey,
    /// The key was recorded with another payload: `Error::PayloadMismatch`.
    PayloadMismatch,
    /// Failed `max_attempts` times: `Error::Parked` (or a handler error that parked).
    Parked,
    /// Any other error that cannot be retried: never expected.
    Unexpected(String),
}

impl Reason {
    /// The reason as stored in the dead-letter table.
    pub fn as_str(&self) -> String {
        match self {
            Reason::Undecodable => "undecodable".to_owned(),
            Reason::MissingKey => "missing key".to_owned(),
            Reason::PayloadMismatch => "payload mismatch".to_owned(),
            Reason::Parked => "parked".to_owned(),
            Reason::Unexpected(text) => format!("unexpected: {text}"),
        }
    }
}

/// How a message must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Its effect applied exactly once, its key `success`.
    Applied,
    /// Moved aside, with this reason, and no effect.
    DeadLetter(Reason),
}

/// Who delivers a message first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The shared queue, `copies` times, shuffled with everything else.
    Queue,
    /// An injector (lock-order pairs, slow bodies, leases running out); its retries go to
    /// the queue.
    Injector,
}

/// One distinct input of the run.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its index in [`Plan::messages`].
    pub id: usize,
    /// The handler it is for.
    pub route: Route,
    /// The bytes delivered.
    pub payload: Vec<u8>,
    /// The payment the payload encodes, where it encodes one.
    pub payment: Option<Payment>,
    /// How it must end.
    pub expect: Fate,
    /// How often the queue delivers it (before retries).
    pub copies: u32,
    /// Who delivers it first.
    pub owner: Owner,
    /// The message whose key this one reuses with another payload: delivered only once
    /// that one has settled.
    pub variant_of: Option<usize>,
    /// What kind of input it is, for the summary.
    pub kind: &'static str,
}

/// Text that has broken systems before: quotes, SQL, format strings, control and
/// direction characters, markup, paths, emoji. Every text field gets some.
pub const HOSTILE: &[&str] = &[
    "'; DROP TABLE ledger_entries; --",
    "\" OR 1=1 --",
    "Robert'); DELETE FROM idem.idem_keys; --",
    "back\\slash \\\\ \\x00 \\u0000",
    "%s %n %x {} {0} $1 $$ ?",
    "<script>alert(1)</script>",
    "\u{202e}desrever\u{202c} text",
    "emoji 💸🧾 and 支付 and ñ",
    "line\nbreak\r\nand\ttab",
    "\u{feff}bom and zero\u{200b}width",
    "${jndi:ldap://example.invalid/a}",
    "../../etc/passwd",
    "NULL",
    "",
    " ",
    "idem:v1",
    "\u{7f}\u{1b}[31mred\u{1b}[0m",
];

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct Size {
    /// Deliveries the queue makes before retries (the copies of every message).
    pub deliveries: usize,
    /// Pairs of payments that lock two accounts in opposite order.
    pub lock_order_pairs: usize,
    /// Transaction-mode payments whose body holds its key past the lock timeout.
    pub slow_bodies: usize,
    /// Lease-mode payments whose first body outlives its lease.
    pub outlived_leases: usize,
    /// Bad inputs of each kind.
    pub bad_inputs_per_kind: usize,
    /// Hard restarts of PostgreSQL, spread over the run.
    pub postgres_restarts: u32,
    /// Workers delivering one message at a time.
    pub workers: usize,
    /// Messages per batch of the batch worker.
    pub batch_size: usize,
}

impl Size {
    /// The variant of the normal test command: a few thousand deliveries, every fault
    /// kind a few times.
    pub fn short() -> Self {
        Size {
            deliveries: 3_000,
            lock_order_pairs: 6,
            slow_bodies: 6,
            outlived_leases: 5,
            bad_inputs_per_kind: 3,
            postgres_restarts: 3,
            workers: 4,
            batch_size: 16,
        }
    }

    /// A run of `deliveries` deliveries, the faults scaled along.
    pub fn scaled(deliveries: usize) -> Self {
        let per_thousand = deliveries.div_ceil(1_000);
        Size {
            deliveries,
            lock_order_pairs: (per_thousand / 2).max(6),
            slow_bodies: (per_thousand / 2).max(6),
            outlived_leases: (per_thousand / 3).max(5),
            bad_inputs_per_kind: (per_thousand / 3).max(3),
            postgres_restarts: u32::try_from(per_thousand / 4).unwrap_or(u32::MAX).max(3),
            workers: 4,
            batch_size: 32,
        }
    }
}

/// Every message of a run, and the queue's order of deliveries.
#[derive(Debug)]
pub struct Plan {
    /// The distinct messages.
    pub messages: Vec<Message>,
    /// The queue's deliveries: message ids, each message `copies` times, shuffled.
    pub queue: Vec<usize>,
    /// Payments delivered together, two by two, by the lock-order injector.
    pub lock_order_pairs: Vec<(usize, usize)>,
    /// Payments delivered three times at once by the slow-body injector.
    pub slow_bodies: Vec<usize>,
    /// Payments delivered twice, a lease apart, by the lease injector.
    pub outlived_leases: Vec<usize>,
    /// Every account a payment can credit, to create before the run.
    pub accounts: Vec<String>,
}

struct Builder<'r> {
    random: &'r mut SeededRandom,
    messages: Vec<Message>,
    accounts: Vec<String>,
}

impl Builder<'_> {
    fn hostile(&mut self) -> &'static str {
        HOSTILE[self.random.below(HOSTILE.len())]
    }

    fn payment(&mut self, behaviour: Behaviour) -> Payment {
        let n = self.messages.len();
        let account = self.accounts[self.random.below(self.accounts.len())].clone();
        Payment {
            payment_id: Some(format!("pay-{n}:{}", self.hostile())),
            account,
            amount_cents: i64::try_from(self.random.between(1, 1_000_000)).unwrap(),
            memo: format!("{} / {}", self.hostile(), self.hostile()),
            behaviour,
            partner: None,
        }
    }

    fn push(
        &mut self,
        route: Route,
        payload: Vec<u8>,
        payment: Option<Payment>,
        expect: Fate,
        owner: Owner,
        kind: &'static str,
    ) -> usize {
        let id = self.messages.len();
        let copies = u32::try_from(self.random.between(1, 4)).unwrap();
        self.messages.push(Message {
            id,
            route,
            payload,
            payment,
            expect,
            copies,
            owner,
            variant_of: None,
            kind,
        });
        id
    }

    fn push_payment(
        &mut self,
        route: Route,
        payment: Payment,
        expect: Fate,
        owner: Owner,
        kind: &'static str,
    ) -> usize {
        let payload = serde_json::to_vec(&payment).unwrap();
        self.push(route, payload, Some(payment), expect, owner, kind)
    }

    fn any_route(&mut self) -> Route {
        [Route::Ledger, Route::External, Route::Receipt][self.random.below(3)]
    }
}

impl Plan {
    /// The messages of a run of `size`, from `random`.
    pub fn new(size: &Size, random: &mut SeededRandom) -> Self {
        let mut accounts: Vec<String> = (0..40).map(|n| format!("acct-{n}")).collect();
        // Names that must stay apart from each other and from the plain ones.
        accounts.extend(
            [
                "acct-'quoted'",
                "acct \"double\"",
                "acct;--",
                "acct-💳",
                "ACCT-0",
                "acct-0 ",
                "acct-\u{202e}0",
                "acct-\\0",
            ]
            .map(str::to_owned),
        );
        let mut builder = Builder {
            random,
            messages: Vec::new(),
            accounts,
        };

        // The injectors' payments.
        let mut lock_order_pairs = Vec::new();
        for n in 0..size.lock_order_pairs {
            let (a, b) = (format!("lock-a-{n}"), format!("lock-b-{n}"));
            builder.accounts.push(a.clone());
            builder.accounts.push(b.clone());
            let mut ids = [0; 2];
            for (slot, (own, partner)) in [(a.clone(), b.clone()), (b.clone(), a.clone())]
                .into_iter()
                .enumerate()
            {
                let mut payment = builder.payment(Behaviour::LockOrder);
                payment.account = own;
                payment.partner = Some(partner);
                ids[slot] = builder.push_payment(
                    Route::Ledger,
                    payment,
                    Fate::Applied,
                    Owner::Injector,
                    "lock-order pair",
                );
            }
            lock_order_pairs.push((ids[0], ids[1]));
        }
        let slow_bodies = (0..size.slow_bodies)
            .map(|_| {
                let payment = builder.payment(Behaviour::Slow);
                builder.push_payment(
                    Route::Ledger,
                    payment,
                    Fate::Applied,
                    Owner::Injector,
                    "slow body",
                )
            })
            .collect();
        let outlived_leases = (0..size.outlived_leases)
            .map(|_| {
                let payment = builder.payment(Behaviour::Slow);
                builder.push_payment(
                    Route::External,
                    payment,
                    Fate::Applied,
                    Owner::Injector,
                    "lease outlived",
                )
            })
            .collect();

        // Bad inputs, on every route.
        for _ in 0..size.bad_inputs_per_kind {
            let route = builder.any_route();
            let undecodable: [&[u8]; 4] = [
                b"not json at all",
                b"{\"payment_id\": \"p\", \"account\": ",
                b"{\"payment_id\": \"p\", \"account\": \"a\", \"amount_cents\": \"ten\", \"memo\": \"\"}",
                b"\xff\xfe{\"payment_id\": \"\xc3\x28\"}",
            ];
            let bytes = undecodable[builder.random.below(undecodable.len())].to_vec();
            builder.push(
                route,
                bytes,
                None,
                Fate::DeadLetter(Reason::Undecodable),
                Owner::Queue,
                "undecodable",
            );
            // Invalid UTF-8 inside a text field of otherwise valid JSON.
            let mut invalid = serde_json::to_vec(&builder.payment(Behaviour::Plain)).unwrap();
            let at = invalid.windows(7).position(|w| w == b"\"memo\":").unwrap() + 8;
            invalid
                .splice(at..at, [0xc3, 0x28, 0xa0, 0xa1])
                .for_each(drop);
            let route = builder.any_route();
            builder.push(
                route,
                invalid,
                None,
                Fate::DeadLetter(Reason::Undecodable),
                Owner::Queue,
                "invalid UTF-8",
            );

            let route = builder.any_route();
            let mut none = builder.payment(Behaviour::Plain);
            none.payment_id = None;
            builder.push_payment(
                route,
                none,
                Fate::DeadLetter(Reason::MissingKey),
                Owner::Queue,
                "null key",
            );
            let mut missing = serde_json::to_value(builder.payment(Behaviour::Plain)).unwrap();
            missing.as_object_mut().unwrap().remove("payment_id");
            let route = builder.any_route();
            builder.push(
                route,
                serde_json::to_vec(&missing).unwrap(),
                None,
                Fate::DeadLetter(Reason::MissingKey),
                Owner::Queue,
                "missing key",
            );

            // Refused by PostgreSQL on every attempt, so parked: NUL bytes, over-long fields.
            let route = builder.any_route();
            let mut nul = builder.payment(Behaviour::Plain);
            nul.memo = format!("nul \0 inside {}", builder.hostile());
            builder.push_payment(
                route,
                nul,
                Fate::DeadLetter(Reason::Parked),
                Owner::Queue,
                "NUL in memo",
            );
            let route = builder.any_route();
            let mut nul_key = builder.payment(Behaviour::Plain);
            nul_key.payment_id = Some(format!("pay-\0-{}", builder.messages.len()));
            builder.push_payment(
                route,
                nul_key,
                Fate::DeadLetter(Reason::Parked),
                Owner::Queue,
                "NUL in key",
            );
            let route = builder.any_route();
            let mut long_memo = builder.payment(Behaviour::Plain);
            long_memo.memo = "m".repeat(20_000);
            builder.push_payment(
                route,
                long_memo,
                Fate::DeadLetter(Reason::Parked),
                Owner::Queue,
                "over-long memo",
            );
            let route = builder.any_route();
            let mut long_account = builder.payment(Behaviour::Plain);
            long_account.account = format!("acct-{}", "a".repeat(300));
            builder.push_payment(
                route,
                long_account,
                Fate::DeadLetter(Reason::Parked),
                Owner::Queue,
                "over-long account",
            );
            let route = builder.any_route();
            let mut long_key = builder.payment(Behaviour::Plain);
            long_key.payment_id = Some(format!(
                "pay-{}-{}",
                builder.messages.len(),
                "k".repeat(100_000)
            ));
            builder.push_payment(
                route,
                long_key,
                Fate::DeadLetter(Reason::Parked),
                Owner::Queue,
                "over-long key",
            );
        }

        // The payments of the queue: about 2.5 deliveries each.
        let first_plain = builder.messages.len();
        let mut queued = builder
            .messages
            .iter()
            .map(|m| m.copies as usize)
            .sum::<usize>();
        while queued < size.deliveries {
            let route = match builder.random.below(10) {
                0..=5 => Route::Ledger,
                6 | 7 => Route::External,
                _ => Route::Receipt,
            };
            let (behaviour, expect, kind) = match builder.random.below(100) {
                0..=3 => (
                    Behaviour::FailsFirstAttempt,
                    Fate::Applied,
                    "fails its first attempt",
                ),
                4 => (
                    Behaviour::AlwaysFails,
                    Fate::DeadLetter(Reason::Parked),
                    "always fails",
                ),
                _ => (Behaviour::Plain, Fate::Applied, "plain"),
            };
            let payment = builder.payment(behaviour);
            let id = builder.push_payment(route, payment, expect, Owner::Queue, kind);
            queued += builder.messages[id].copies as usize;
        }

        // The same key with another payload, after the first has settled: only on scopes
        // whose keys are kept (a purged receipt key would take the other payload as new).
        let originals: Vec<usize> = (first_plain..builder.messages.len())
            .filter(|&id| {
                let message = &builder.messages[id];
                message.route != Route::Receipt
                    && message
                        .payment
                        .as_ref()
                        .is_some_and(|p| p.behaviour == Behaviour::Plain)
            })
            .take(size.bad_inputs_per_kind * 2)
            .collect();
        for original in originals {
            let source = &builder.messages[original];
            let route = source.route;
            let mut payment = source.payment.clone().unwrap();
            payment.amount_cents += 1;
            let id = builder.push_payment(
                route,
                payment,
                Fate::DeadLetter(Reason::PayloadMismatch),
                Owner::Queue,
                "same key, other payload",
            );
            builder.messages[id].variant_of = Some(original);
        }

        let mut queue: Vec<usize> = builder
            .messages
            .iter()
            .filter(|m| m.owner == Owner::Queue)
            .flat_map(|m| std::iter::repeat_n(m.id, m.copies as usize))
            .collect();
        builder.random.shuffle(&mut queue);
        let accounts = builder.accounts;
        Plan {
            messages: builder.messages,
            queue,
            lock_order_pairs,
            slow_bodies,
            outlived_leases,
            accounts,
        }
    }
}
