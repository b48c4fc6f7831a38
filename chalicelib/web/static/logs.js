// A job's log view, kept current at little cost: the latest lines once, then
// only what is new. Pure (it is given the API's logs call), so it runs under
// node too.
//
// The first read asks for the last TAIL lines (`tail`). After that, each
// refresh makes one request at most, for at most PAGE lines, and the server
// cuts every page under 6 MB. While the server hands out a next_page_token,
// the next refresh follows it, with the same other parameters (a token is
// bound to them). At the end of what has been shipped so far, the next
// refresh asks again with `since` set to the last line's time, as
// `gpujobs logs -f` does. Lines seen before (by id) are dropped, since that
// read starts at the last line's millisecond. The page keeps the last SHOWN
// lines. A new attempt starts the view afresh.

/** Lines asked for first: the latest ones. */
export const TAIL = 200;
/** Lines asked for by each later request. */
export const PAGE = 500;
/** Lines the page keeps, the newest. */
export const SHOWN = 2000;

export class LogFollower {
  /** `read(query)`: the API's logs call, {attempt, lines, nextPageToken} or null (no logs served). */
  constructor(read) {
    this.read = read;
    this.lines = []; // what the view shows, oldest first; null: the server serves no logs
    this.attempt = null;
    this.query = null; // the query the pending token belongs to
    this.token = null;
    this.ids = new Set(); // of the lines kept
    this.dropped = 0; // lines no longer kept (over SHOWN)
    this.version = 0; // bumped when the lines change
    this.requests = 0;
  }

  /** Whether the last read left more to read now (a next_page_token). */
  get behind() { return this.token != null; }

  /** The query the next refresh sends. */
  next() {
    if (this.token != null) return { ...this.query, page_token: this.token };
    const last = this.lines && this.lines.length ? this.lines[this.lines.length - 1] : null;
    if (last && last.at) return { since: last.at, page_size: PAGE };
    return { tail: TAIL };
  }

  /** One request, at most; true when the lines changed. */
  async refresh() {
    const query = this.next();
    this.requests++;
    const page = await this.read(query);
    if (page == null) {
      const changed = this.lines !== null;
      this.lines = null;
      this.token = null;
      if (changed) this.version++;
      return changed;
    }
    let changed = false;
    if (this.lines === null || (page.attempt != null && this.attempt != null && page.attempt !== this.attempt)) {
      this.lines = []; // a new attempt (or logs served again): its own lines only
      this.ids = new Set();
      this.dropped = 0;
      changed = true;
    }
    if (page.attempt != null) this.attempt = page.attempt;
    const { page_token: _, ...bound } = query;
    this.query = bound;
    this.token = page.nextPageToken || null;
    for (const line of page.lines || []) {
      if (line.id != null && this.ids.has(line.id)) continue;
      if (line.id != null) this.ids.add(line.id);
      this.lines.push(line);
      changed = true;
    }
    if (this.lines.length > SHOWN) {
      const gone = this.lines.splice(0, this.lines.length - SHOWN);
      for (const line of gone) this.ids.delete(line.id);
      this.dropped += gone.length;
    }
    if (changed) this.version++;
    return changed;
  }
}
