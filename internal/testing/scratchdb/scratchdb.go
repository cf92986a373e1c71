// Package scratchdb creates and drops throwaway databases on a server given
// by an admin URL: the benchmarks and the end-to-end suite each measure on a
// database of their own, so nothing they load or delete touches another's.
package scratchdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
)

// Create creates an empty database named prefix_<random> on the server of
// adminURL and returns its URL and a function that drops it (WITH (FORCE),
// so connections left open do not keep it alive).
func Create(ctx context.Context, adminURL, prefix string) (string, func(context.Context) error, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("scratchdb: name: %w", err)
	}
	name := prefix + "_" + hex.EncodeToString(b)
	dbURL, err := WithDatabase(adminURL, name, "")
	if err != nil {
		return "", nil, err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("scratchdb: connect admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("scratchdb: create database: %w", err)
	}
	drop := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return fmt.Errorf("scratchdb: drop database: connect: %w", err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("scratchdb: drop database: %w", err)
		}
		return nil
	}
	return dbURL, drop, nil
}

// WithDatabase returns rawURL naming another database and, when hostPort is
// not empty, another host and port (a proxy in front of the same server).
func WithDatabase(rawURL, database, hostPort string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("scratchdb: parse database url: %w", err)
	}
	u.Path = "/" + database
	if hostPort != "" {
		u.Host = hostPort
	}
	return u.String(), nil
}
