// Package page is the live status page every daemon serves at / of its metrics address: one
// HTML page, its script and its style sheet, embedded in the binary (nothing to install). The
// script polls the role's status document (status.json, the same document as /status) once a
// second and draws what it shows: for a tunnel each path's rate, RTT, loss and state over the
// last five minutes, for a proxy its connections and subflows, for a balancer its backends and
// their shares, for the other roles their counters and the document itself.
//
// The page makes no request to any other host: its Content-Security-Policy allows scripts,
// styles and fetches from its own origin only, so a page changed to load something from
// elsewhere fails in the browser (the browser test reads its console).
package page

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed ui
var files embed.FS

// policy is the Content-Security-Policy of every file: the page's own origin only, and the
// empty data: icon (without it the browser asks for /favicon.ico).
const policy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Register adds the page to mux: GET / (the page) and GET /ui/ (its script and style sheet).
// The status document it polls is the caller's, at status.json beside the page.
func Register(mux *http.ServeMux) {
	ui, _ := fs.Sub(files, "ui") // the embedded directory: cannot fail
	static := http.StripPrefix("/ui/", http.FileServerFS(ui))
	mux.Handle("GET /ui/", secured(static))
	mux.Handle("GET /{$}", secured(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, ui, "index.html")
	})))
}

func secured(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", policy)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}
