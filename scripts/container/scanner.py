"""A stand-in scanner for scripts/container-check: accepts each job that
`quota-gate consume --post` sends and records it, one `scanned <scanId>
attempt <n>` line on standard output, which the check reads in the
container's log. It scans nothing. A repeat of a scanId is answered 200
again, as docs/consumer.md asks of a scanner."""

import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Scanner(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            scan_id = json.loads(body)["scanId"]
        except (ValueError, KeyError, TypeError):
            self.send_response(400)
            self.end_headers()
            return
        print(f"scanned {scan_id} attempt {self.headers.get('x-scan-attempt')}", flush=True)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    # PID 1 in its container: without a handler SIGTERM would be ignored
    # and the stop would wait for SIGKILL.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = HTTPServer(("0.0.0.0", int(sys.argv[1])), Scanner)
    server.serve_forever()
