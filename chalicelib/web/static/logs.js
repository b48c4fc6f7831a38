// A job's log view, kept current at little cost: the latest lines once, then
// only what is new. Pure (it is given the API's logs call), so it runs under
// node too.
//
// The first read asks for the last TAIL lines (`tail`): the server finds the
// newest across the ranks and hands out a follow_token, the position after
// the newest line. After that, each refresh makes one request at most, for at
// most PAGE lines, with that token: while the server hands out a
// next_page_token (more to read now) it is followed, and at the end of what
// has been shipped so far the page's follow_token is asked again, which
// answers with what was appended after it only. The server orders lines by
// (time, rank, seq) and a token resumes exactly after its last line, so no
// line comes twice; lines are still checked against the last seq kept of
// their rank and their id. The page keeps the last SHOWN lines. A token the
// server refuses (a new attempt: a token is bound to its attempt) or a new
// attempt starts the view afresh, from its tail.

/** Lines asked for first: the latest ones. */
export const TAIL = 200;
/** Lines asked for by each later request. */
export const PAGE = 500;
/** Lines the page keeps, the newest. */
export const SHOWN = 2000;

export class LogFollower {
  /** `read(query)`: the API's logs call, {attempt, lines, nextPageToken, followToken} or null (no logs served). */
  constructor(read) {
    this.read = read;
    this.lines = []; // what the view shows, oldest first; null: the server serves no logs
    this.attempt = null;
    this.token = null; // where the next refresh reads from
    this.behindNow = false; // the last page said more follows now
    this.ids = new Set(); // of the lines kept
    this.seqs = new Map(); // rank -> the last seq kept of it
    this.dropped = 0; // lines no longer kept (over SHOWN)
    this.version = 0; // bumped when the lines change
    this.requests = 0;
  }

  /** Whether the last read left more to read now (a next_page_token). */
  get behind() { return this.behindNow; }

  /** The query the next refresh sends. */
  next() {
    if (this.token != null) return { page_token: this.token, page_size: PAGE };
    return { tail: TAIL };
  }

  /** One request, at most (two when a token is refused); true when the lines changed. */
  async refresh() {
    let query = this.next();
    this.requests++;
    let page;
    let refused = false;
    try {
      page = await this.read(query);
    } catch (e) {
      if (!(query.page_token != null && e && e.status === 400)) throw e;
      refused = true; // a token of another attempt: afresh, from the tail
      this.token = null;
      query = this.next();
      this.requests++;
      page = await this.read(query);
    }
    if (page == null) {
      const changed = this.lines !== null;
      this.lines = null;
      this.token = null;
      this.behindNow = false;
      if (changed) this.version++;
      return changed;
    }
    let changed = false;
    if (this.lines === null || refused
        || (page.attempt != null && this.attempt != null && page.attempt !== this.attempt)) {
      this.lines = []; // a new attempt (or logs served again): its own lines only
      this.ids = new Set();
      this.seqs = new Map();
      this.dropped = 0;
      changed = true;
    }
    if (page.attempt != null) this.attempt = page.attempt;
    this.token = page.nextPageToken || page.followToken || this.token;
    this.behindNow = page.nextPageToken != null;
    for (const line of page.lines || []) {
      if (line.id != null && this.ids.has(line.id)) continue;
      if (line.seq != null && this.seqs.has(line.rank) && line.seq <= this.seqs.get(line.rank)) continue;
      if (line.id != null) this.ids.add(line.id);
      if (line.seq != null) this.seqs.set(line.rank, line.seq);
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
