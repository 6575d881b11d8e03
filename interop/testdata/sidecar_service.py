"""A service behind `idem consume`, for the sidecar tests: it counts its
executions per message ID in a SQLite file (Python's sqlite3), so the
count survives anything that happens to the sidecar.

  python3 sidecar_service.py DB_PATH DELAY_MS STORE_PATH CONSUMER

It listens on 127.0.0.1 on a free port and prints the port on the first
line of stdout.

  POST /in     executes the message: one more execution of its
               Idem-Message-Id, after DELAY_MS; answers 200
  POST /nodelay  executes the requests that arrive from now on at once
  POST /dead   records a dead letter: its original message ID
               (Idem-Header-Idem-Original-Message-Id) and reason
               (Idem-Header-Idem-Dead-Letter-Reason); answers 200
  GET /requests  {"requests": n}: executions so far, cheaply
  GET /counts  {"execs": {id: n}, "dead": {id: [reasons]}, "requests": n,
               "records": {id: [state, unknown]}, "arrivals": {id: n}}:
               arrivals counts the POST /in requests that reached the
               service (before DELAY_MS, so a call cut short by a crash
               of the sidecar counts); records are read from
               the sidecar's SQLite store (STORE_PATH, consumer CONSUMER),
               state 2 is completed, unknown is true when the recorded
               answer is the sidecar's outcome-unknown
"""
import json
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

db_path = sys.argv[1]
delay = float(sys.argv[2]) / 1000
store_path, consumer = sys.argv[3], sys.argv[4]
lock = threading.Lock()
db = sqlite3.connect(db_path, check_same_thread=False)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=NORMAL")  # durable across crashes of this process, no fsync per commit
db.execute("CREATE TABLE IF NOT EXISTS execs (id TEXT PRIMARY KEY, n INTEGER NOT NULL)")
db.execute("CREATE TABLE IF NOT EXISTS dead (id TEXT NOT NULL, reason TEXT NOT NULL)")
db.commit()
requests = 0
arrivals = {}  # POST /in requests received per message ID, in memory


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        b = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_POST(self):
        global requests, delay
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.path == "/in":
            mid = self.headers.get("Idem-Message-Id", "")
            with lock:
                arrivals[mid] = arrivals.get(mid, 0) + 1
            if delay:
                time.sleep(delay)
            with lock:
                requests += 1
                db.execute("INSERT INTO execs (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1", (mid,))
                db.commit()
            self.answer(200, {"executed": mid})
        elif self.path == "/nodelay":
            delay = 0
            self.answer(200, {"delay_ms": 0})
        elif self.path == "/dead":
            orig = self.headers.get("Idem-Header-Idem-Original-Message-Id", "")
            reason = self.headers.get("Idem-Header-Idem-Dead-Letter-Reason", "")
            with lock:
                db.execute("INSERT INTO dead (id, reason) VALUES (?, ?)", (orig, reason))
                db.commit()
            self.answer(200, {"recorded": orig})
        else:
            self.answer(404, {"error": "no such path"})

    def do_GET(self):
        if self.path == "/requests":
            with lock:
                n = requests
            self.answer(200, {"requests": n})
            return
        if self.path != "/counts":
            self.answer(404, {"error": "no such path"})
            return
        with lock:
            execs = dict(db.execute("SELECT id, n FROM execs").fetchall())
            dead = {}
            for mid, reason in db.execute("SELECT id, reason FROM dead"):
                dead.setdefault(mid, []).append(reason)
            n = requests
            arrived = dict(arrivals)
        records = {}
        try:
            st = sqlite3.connect(store_path, timeout=2)
            try:
                rows = st.execute("SELECT message_id, state, result FROM idem_processed WHERE consumer = ?", (consumer,)).fetchall()
            finally:
                st.close()
            for mid, state, result in rows:
                unknown = False
                if result:
                    unknown = bool(json.loads(result).get("unknown"))
                records[mid] = [state, unknown]
        except sqlite3.OperationalError:
            pass  # the sidecar has not created its store yet
        self.answer(200, {"execs": execs, "dead": dead, "requests": n, "records": records, "arrivals": arrived})


class Server(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A sidecar killed while it waits for an answer leaves a broken
        # pipe here: the test's point, not an error of the service.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


srv = Server(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)
srv.serve_forever()
