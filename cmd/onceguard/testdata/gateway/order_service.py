"""The seeds' Python order-payment service, standard library only.

As written there: the user from X-User-Id (set by the proxy in front),
the order read and checked unpaid, the wallet charged, the order marked
paid and the payment recorded, in separate statements with no lock and
no key check. In front of it, `onceguard gateway` keeps one intent one
payment.

  python3 order_service.py setup DB
  python3 order_service.py serve DB PORT

POST /orders {"amount": CENTS}          201 {"id"}
POST /orders/ID/pay {"method":"wallet"} 201 {"order_id","payment_id","status":"paid"}, 409, 404
GET  /state?order=ID                    payments of the order, balance, requests seen by key
The header X-Test-Delay-Ms sets how long the wallet charge takes (default 100).
"""
import json
import re
import sqlite3
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DB = sys.argv[2] if len(sys.argv) > 2 else ""


def db():
    c = sqlite3.connect(DB, timeout=30, isolation_level=None)
    c.execute("PRAGMA busy_timeout = 30000")
    return c


def setup():
    c = db()
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("CREATE TABLE users (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
    c.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT, amount INTEGER, status TEXT)")
    c.execute("CREATE TABLE payments (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER, amount INTEGER, key TEXT)")
    c.execute("CREATE TABLE seen (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, path TEXT)")
    c.execute("INSERT INTO users VALUES ('u1', 1000000), ('u2', 1000000)")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real service behind a proxy

    def log_message(self, fmt, *args):
        pass

    def answer(self, status, v):
        b = json.dumps(v).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        user = self.headers.get("X-User-Id") or ""
        if not user:
            return self.answer(401, {"error": "unauthenticated"})
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self.answer(400, {"error": "invalid_json"})
        c = db()
        path = urlparse(self.path).path
        if path == "/orders":
            cur = c.execute("INSERT INTO orders (user_id, amount, status) VALUES (?, ?, 'created')", (user, int(body.get("amount", 0))))
            return self.answer(201, {"id": cur.lastrowid})
        m = re.fullmatch(r"/orders/(\d+)/pay", path)
        if not m:
            return self.answer(404, {"error": "not_found"})
        key = self.headers.get("Idempotency-Key") or ""
        c.execute("INSERT INTO seen (key, path) VALUES (?, ?)", (key, path))
        order_id = int(m.group(1))
        row = c.execute("SELECT amount, status FROM orders WHERE id = ? AND user_id = ?", (order_id, user)).fetchone()
        if row is None:
            return self.answer(404, {"error": "not_found"})
        amount, status = row
        if status == "paid":
            return self.answer(409, {"error": "order_already_paid"})
        (balance,) = c.execute("SELECT balance FROM users WHERE id = ?", (user,)).fetchone()
        if balance < amount:
            return self.answer(422, {"error": "insufficient_funds"})
        time.sleep(int(self.headers.get("X-Test-Delay-Ms") or 100) / 1000)  # the wallet charge
        c.execute("UPDATE users SET balance = ? WHERE id = ?", (balance - amount, user))
        c.execute("UPDATE orders SET status = 'paid' WHERE id = ?", (order_id,))
        cur = c.execute("INSERT INTO payments (order_id, amount, key) VALUES (?, ?, ?)", (order_id, amount, key))
        return self.answer(201, {"order_id": order_id, "payment_id": cur.lastrowid, "status": "paid", "amount": amount})

    def do_GET(self):
        u = urlparse(self.path)
        if u.path != "/state":
            return self.answer(404, {"error": "not_found"})
        order = int(parse_qs(u.query).get("order", ["0"])[0])
        c = db()
        (payments,) = c.execute("SELECT COUNT(*) FROM payments WHERE order_id = ?", (order,)).fetchone()
        seen = dict(c.execute("SELECT key, COUNT(*) FROM seen WHERE path = ? GROUP BY key", ("/orders/%d/pay" % order,)).fetchall())
        user = self.headers.get("X-User-Id") or ""
        row = c.execute("SELECT balance FROM users WHERE id = ?", (user,)).fetchone()
        self.answer(200, {"payments": payments, "seen": seen, "balance": row[0] if row else None})


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup()
    else:
        srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[3])), Handler)
        srv.daemon_threads = True
        print("listening on", srv.server_address, flush=True)
        srv.serve_forever()
