// Command rocketrides-simulator creates riders and sends Rocket Rides
// traffic with a configurable share of clients that give up mid-request,
// then prints what happened.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemd/idemd/examples/rocketrides/api"
	"github.com/idemd/idemd/examples/rocketrides/fakestripe"
	"github.com/idemd/idemd/examples/rocketrides/simulator"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/logging"
)

type cli struct {
	config.Database `embed:""`
	config.Logging  `embed:""`

	APIURL       string        `name:"api-url" default:"http://127.0.0.1:8080" help:"Rocket Rides base URL."`
	Users        int           `name:"users" default:"5" help:"Riders to create."`
	DeclineUsers int           `name:"decline-users" default:"1" help:"Of those, riders whose card is declined."`
	Duration     time.Duration `name:"duration" default:"20s" help:"How long to send traffic."`
	Rides        int           `name:"rides" default:"0" help:"Stop after this many rides (0: run for --duration)."`
	Concurrency  int           `name:"concurrency" default:"8" help:"Parallel clients."`
	GiveUpRate   float64       `name:"give-up-rate" default:"0.1" help:"Fraction of rides whose client gives up mid-request (0..1)."`
	GiveUpAfter  time.Duration `name:"give-up-after" default:"50ms" help:"A giving-up client waits at most this long."`
	MaxRetries   int           `name:"max-retries" default:"2" help:"Retries with the same key after 409/5xx before abandoning."`
	JSON         bool          `name:"json" help:"Print the summary as JSON."`
}

func (c *cli) Check() []string {
	p := c.Database.Check()
	if c.Users <= 0 || c.DeclineUsers < 0 || c.DeclineUsers > c.Users {
		p = append(p, "--users must be positive and --decline-users within 0..--users")
	}
	if c.GiveUpRate < 0 || c.GiveUpRate > 1 {
		p = append(p, "--give-up-rate must be within 0..1")
	}
	if c.Concurrency <= 0 {
		p = append(p, "--concurrency must be positive")
	}
	return p
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	var c cli
	if _, err := config.Parse("rocketrides-simulator", "Sends Rocket Rides traffic with abandoned requests.", &c, args, stdout); err != nil {
		if errors.Is(err, config.ErrHelp) {
			return daemon.ExitOK
		}
		fmt.Fprintf(stderr, "rocketrides-simulator: %v\n", err)
		return daemon.ExitConfig
	}
	log, err := logging.New(c.LogFormat, c.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "rocketrides-simulator: %v\n", err)
		return daemon.ExitConfig
	}
	defer log.Sync() //nolint:errcheck
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pool, _, err := daemon.NewPool(ctx, c.Database, "rocketrides-simulator", nil)
	if err != nil {
		fmt.Fprintf(stderr, "rocketrides-simulator: --database-url: %v\n", err)
		return daemon.ExitConfig
	}
	defer pool.Close()

	// Riders of this run, with fresh random API keys (kept in memory only).
	run := randomHex(4)
	var keys []string
	for i := range c.Users {
		key := "sk_sim_" + randomHex(16)
		customer := fmt.Sprintf("cus_sim_%s_%d", run, i)
		if i < c.DeclineUsers {
			customer = fmt.Sprintf("%s_sim_%s_%d", fakestripe.DeclinePrefix, run, i)
		}
		if _, err := api.CreateUser(ctx, pool, fmt.Sprintf("rider-%s-%d@example.com", run, i), customer, key); err != nil {
			fmt.Fprintf(stderr, "rocketrides-simulator: %v\n", err)
			return daemon.ExitRuntime
		}
		keys = append(keys, key)
	}

	stats, err := simulator.Run(ctx, simulator.Config{
		BaseURL: c.APIURL, APIKeys: keys, Concurrency: c.Concurrency, Duration: c.Duration, Rides: c.Rides,
		GiveUpRate: c.GiveUpRate, GiveUpAfter: c.GiveUpAfter, MaxRetries: c.MaxRetries, Logger: log,
	})
	if c.JSON {
		_ = json.NewEncoder(stdout).Encode(stats)
	} else {
		fmt.Fprintln(stdout, "simulator:", stats)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "rocketrides-simulator: %v\n", err)
		return daemon.ExitRuntime
	}
	return daemon.ExitOK
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
