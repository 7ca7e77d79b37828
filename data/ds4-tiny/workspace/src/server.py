"""A tiny HTTP front end for the catalogue."""
import http.server

REQUEST_TIMEOUT = 30
MAX_BODY_BYTES = 65536


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"bookshelf\n")


def serve(port, debug=False):
    httpd = http.server.HTTPServer(("127.0.0.1", port), Handler)
    httpd.timeout = REQUEST_TIMEOUT
    httpd.serve_forever()
