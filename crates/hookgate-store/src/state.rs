//! The delivery state machine's states and outcomes, each mapped to its text, in SQL and in
//! evidence alike, here and nowhere else.
//!
//! An item moves `pending` → `done` | `dead` | `skipped_stale`, or back to `pending` for a
//! retry; a replay moves `dead` → `pending`. An event is `accepted` while any of its items is
//! pending, then `dead` if one was dead-lettered, else `done`. An item in flight is `pending`:
//! its entity's row names it (see the `delivery` module), and operators see it as
//! [`WriteView::InFlight`].
//!
//! The text of each is written once, in [`sql_text!`]: the enums' `as_str` and the statements'
//! literals (through [`sql_literal!`], so that statements stay `const` text and PostgreSQL can
//! prove their state conditions imply the partial indexes' predicates) both expand it.

use std::fmt;

/// The text of a state or outcome, e.g. `sql_text!(ItemState::Pending)` is `"pending"`.
macro_rules! sql_text {
    (ItemState::Pending) => {
        "pending"
    };
    (ItemState::Done) => {
        "done"
    };
    (ItemState::Dead) => {
        "dead"
    };
    (ItemState::SkippedStale) => {
        "skipped_stale"
    };
    (EventState::Accepted) => {
        "accepted"
    };
    (EventState::Done) => {
        "done"
    };
    (EventState::Dead) => {
        "dead"
    };
    (WriteView::InFlight) => {
        "in_flight"
    };
    (DeliveryOutcome::Accepted) => {
        "accepted"
    };
    (DeliveryOutcome::Duplicate) => {
        "duplicate"
    };
    (DeliveryOutcome::Conflict) => {
        "conflict"
    };
    (DeliveryOutcome::Rejected) => {
        "rejected"
    };
    (AttemptOutcome::Created) => {
        "created"
    };
    (AttemptOutcome::Updated) => {
        "updated"
    };
    (AttemptOutcome::Reconciled) => {
        "reconciled"
    };
    (AttemptOutcome::NotApplied) => {
        "not_applied"
    };
    (AttemptOutcome::NotFound) => {
        "not_found"
    };
    (AttemptOutcome::Fetched) => {
        "fetched"
    };
    (AttemptOutcome::SourceGone) => {
        "source_gone"
    };
    (AttemptOutcome::SkippedStale) => {
        "skipped_stale"
    };
    (AttemptOutcome::Dead) => {
        "dead"
    };
    (AttemptOutcome::Rejected) => {
        "rejected"
    };
    (AttemptOutcome::Retryable) => {
        "retryable"
    };
    (AttemptOutcome::RateLimited) => {
        "rate_limited"
    };
    (AttemptOutcome::Ambiguous) => {
        "ambiguous"
    };
    (AttemptOutcome::Misconfigured) => {
        "misconfigured"
    };
    (AttemptOutcome::Abandoned) => {
        "abandoned"
    };
    (AttemptOutcome::ReplayRequested) => {
        "replay_requested"
    };
}

/// A state or outcome as a quoted SQL literal, for statement text: `'pending'`.
macro_rules! sql_literal {
    ($kind:ident :: $variant:ident) => {
        concat!("'", sql_text!($kind::$variant), "'")
    };
}

/// An enum whose every variant has its text in [`sql_text!`], with `as_str`, `parse`, `ALL`
/// and `Display` over that text.
macro_rules! texts {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[$name] = &[$($name::$variant),*];

            /// Its text, as stored and as evidence shows it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => sql_text!($name::$variant),)*
                }
            }

            /// Every value's text, for messages: `pending, done, …`.
            pub fn names() -> String {
                $name::ALL.iter().map(|value| value.as_str()).collect::<Vec<_>>().join(", ")
            }

            /// The value whose text this is.
            pub fn parse(text: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|value| value.as_str() == text)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        // Shown as its text in JSON evidence too.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        // Stored as its text, on either backend.
        impl<DB: sqlx::Database> sqlx::Type<DB> for $name
        where
            str: sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as sqlx::Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: sqlx::Database> sqlx::Encode<'q, DB> for $name
        where
            &'q str: sqlx::Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut <DB as sqlx::Database>::ArgumentBuffer<'q>,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<'q, DB>>::encode(self.as_str(), buf)
            }
        }

        impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for $name
        where
            &'r str: sqlx::Decode<'r, DB>,
        {
            fn decode(
                value: <DB as sqlx::Database>::ValueRef<'r>,
            ) -> Result<$name, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<'r, DB>>::decode(value)?;
                $name::parse(text).ok_or_else(|| {
                    format!(concat!("`{}` is not a known ", stringify!($name)), text).into()
                })
            }
        }
    };
}

texts! {
    /// The state of an outbox item: one write of one event to one target.
    pub enum ItemState {
        /// To do: due at its `next_attempt_at_ms`, or in flight under its entity's lease.
        Pending,
        /// Written, or found already written.
        Done,
        /// Dead-lettered: it could not succeed, or ran out of attempts. A replay makes it
        /// pending again.
        Dead,
        /// Not written: a newer version of its entity was applied (or may have been), or
        /// its source object is gone.
        SkippedStale,
    }
}

impl ItemState {
    /// Whether the item has reached an end (its `finished_at_ms` is set).
    pub const fn is_finished(self) -> bool {
        !matches!(self, ItemState::Pending)
    }
}

texts! {
    /// The state of an event, derived from its items' states.
    pub enum EventState {
        /// Some item is pending.
        Accepted,
        /// Every item is done or skipped (or it had none).
        Done,
        /// No item is pending, and one is dead.
        Dead,
    }
}

impl EventState {
    /// The state of an event whose only item is in `item`.
    pub const fn of_only_item(item: ItemState) -> EventState {
        match item {
            ItemState::Pending => EventState::Accepted,
            ItemState::Dead => EventState::Dead,
            ItemState::Done | ItemState::SkippedStale => EventState::Done,
        }
    }
}

/// A write as operators see it: its item's state, or in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteView {
    /// Pending, and named on its entity's row by the lease that has it out: a write of it
    /// may be on its way to the CRM right now.
    InFlight,
    Item(ItemState),
}

impl WriteView {
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteView::InFlight => sql_text!(WriteView::InFlight),
            WriteView::Item(state) => state.as_str(),
        }
    }
}

impl serde::Serialize for WriteView {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for WriteView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

texts! {
    /// What became of one delivery at intake, as its evidence row says.
    pub enum DeliveryOutcome {
        /// The first delivery of its key: a new event.
        Accepted,
        /// The same key and content as an event already stored.
        Duplicate,
        /// The same key as an event already stored, with other content: kept beside it.
        Conflict,
        /// Signed correctly, but no event could be derived from it: kept with the reason.
        Rejected,
    }
}

texts! {
    /// How one call of an attempt (or a decision taken without a call) ended.
    pub enum AttemptOutcome {
        /// The upsert created the record.
        Created,
        /// The upsert updated the record.
        Updated,
        /// A lookup found the write already in the CRM.
        Reconciled,
        /// A lookup found the record without this write.
        NotApplied,
        /// A lookup found no record.
        NotFound,
        /// A refresh fetched the source object.
        Fetched,
        /// A refresh found the source object gone.
        SourceGone,
        /// The version guard found the write stale.
        SkippedStale,
        /// Dead-lettered before any call (nothing to render, nothing configured).
        Dead,
        /// The CRM refused the write, or the source the fetch, for good.
        Rejected,
        /// A failure worth retrying.
        Retryable,
        /// The CRM's rate limit refused the call.
        RateLimited,
        /// The call may or may not have been applied.
        Ambiguous,
        /// The connector's configuration or credentials are wrong.
        Misconfigured,
        /// The lease ended with the write in flight: it may have been sent.
        Abandoned,
        /// An operator queued the dead write again.
        ReplayRequested,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every text parses back to its value, and no two values of one kind share a text.
    #[test]
    fn texts_round_trip() {
        fn check<T: Copy + PartialEq + fmt::Debug>(
            all: &[T],
            text: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            for &value in all {
                assert_eq!(parse(text(value)), Some(value), "{value:?}");
            }
            let mut texts: Vec<_> = all.iter().map(|&v| text(v)).collect();
            texts.sort_unstable();
            texts.dedup();
            assert_eq!(texts.len(), all.len());
        }
        check(ItemState::ALL, ItemState::as_str, ItemState::parse);
        check(EventState::ALL, EventState::as_str, EventState::parse);
        check(DeliveryOutcome::ALL, DeliveryOutcome::as_str, DeliveryOutcome::parse);
        check(AttemptOutcome::ALL, AttemptOutcome::as_str, AttemptOutcome::parse);
        assert_eq!(ItemState::parse("in_flight"), None, "in flight is not an item state");
        assert_eq!(sql_literal!(ItemState::SkippedStale), "'skipped_stale'");
        // Tables of evidence pad them like the text they are.
        assert_eq!(format!("[{:<9}]", EventState::Done), "[done     ]");
    }

    #[test]
    fn an_only_item_decides_its_event() {
        let events: Vec<_> = ItemState::ALL.iter().map(|&s| EventState::of_only_item(s)).collect();
        assert_eq!(
            events,
            [EventState::Accepted, EventState::Done, EventState::Dead, EventState::Done]
        );
    }
}
