package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// User is a Rocket Rides rider.
type User struct {
	ID               int64
	Email            string
	StripeCustomerID string
}

// CreateUser adds a rider who authenticates with apiKey (stored hashed).
func CreateUser(ctx context.Context, pool *pgxpool.Pool, email, stripeCustomerID, apiKey string) (int64, error) {
	if apiKey == "" {
		return 0, errors.New("rocketrides: create user: empty API key")
	}
	var id int64
	err := pool.QueryRow(ctx, `INSERT INTO users (email, stripe_customer_id, api_key_sha256)
		VALUES ($1, $2, $3) RETURNING id`, email, stripeCustomerID, hashAPIKey(apiKey)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("rocketrides: create user %s: %w", email, err)
	}
	return id, nil
}

func hashAPIKey(k string) string {
	h := sha256.Sum256([]byte(k))
	return hex.EncodeToString(h[:])
}

var errNoUser = errors.New("no such user")

func userByAPIKey(ctx context.Context, pool *pgxpool.Pool, apiKey string) (*User, error) {
	return scanUser(pool.QueryRow(ctx, `SELECT id, email, stripe_customer_id FROM users WHERE api_key_sha256 = $1`, hashAPIKey(apiKey)))
}

func userByID(ctx context.Context, pool *pgxpool.Pool, id int64) (*User, error) {
	return scanUser(pool.QueryRow(ctx, `SELECT id, email, stripe_customer_id FROM users WHERE id = $1`, id))
}

func scanUser(row pgx.Row) (*User, error) {
	var u User
	if err := row.Scan(&u.ID, &u.Email, &u.StripeCustomerID); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, errNoUser
		}
		return nil, err
	}
	return &u, nil
}
