-- A finish changes its event's state (accepted, then done or dead), in a batch with the other
-- writes of its lease: events received together, so rows that share pages, in one
-- transaction. A row's old version is dead only once that transaction commits, so its new
-- version stays on its page (a HOT update: no entry in any of the four indexes of `events`)
-- only where the page kept room for a second copy of its rows. At the fill factor of 90 that
-- `0005` set, about one state change in six found room (measured by `cargo xtask bench`, which
-- prints each table's HOT updates); half of each new page is now kept for them. Pages written
-- before keep their fill.
ALTER TABLE events SET (fillfactor = 50);
