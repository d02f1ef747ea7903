"""teams and their API tokens (only a hash of each secret), each run's and work unit's team, and the default team
that runs recorded before teams (and runs the CLI records) belong to

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    teams = op.create_table(
        'teams',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('share', sa.Float(), server_default='1', nullable=False),
        sa.Column('max_gpus', sa.Integer(), nullable=True),
        sa.Column('monthly_micro_usd', sa.BigInteger(), nullable=True),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_teams')),
        sa.UniqueConstraint('name', name=op.f('uq_teams_name')),
    )
    op.create_table(
        'tokens',
        sa.Column('team_id', sa.Integer(), nullable=False),
        sa.Column('secret_sha256', sa.String(length=64), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id'], name=op.f('fk_tokens_team_id_teams'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_tokens')),
        sa.UniqueConstraint('secret_sha256', name=op.f('uq_tokens_secret_sha256')),
    )
    op.create_index(op.f('ix_tokens_team_id'), 'tokens', ['team_id'])
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('team_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(batch.f('fk_runs_team_id_teams'), 'teams', ['team_id'], ['id'])
        batch.create_index(batch.f('ix_runs_team_id'), ['team_id'])
    with op.batch_alter_table('work_units') as batch:
        batch.add_column(sa.Column('team_id', sa.Integer(), nullable=True))
    # The default team: every run so far is its (team_id NULL reads as it too; jobs.db.teams).
    now = sa.func.now()
    op.execute(teams.insert().values(name='default', share=1.0, created_at=now, updated_at=now))
    op.execute("UPDATE runs SET team_id = (SELECT id FROM teams WHERE name = 'default')")
    op.execute("UPDATE work_units SET team_id = (SELECT id FROM teams WHERE name = 'default')")
    # The fair share's probes (jobs.claims.fair): a team's best claimable unit of a model is its range's first entry.
    op.create_index('ix_work_units_claim_team', 'work_units',
                    ['status', 'ready', 'team_id', 'model', sa.text('rank DESC'), 'id'])


def downgrade() -> None:
    op.drop_index('ix_work_units_claim_team', table_name='work_units')
    with op.batch_alter_table('work_units') as batch:
        batch.drop_column('team_id')
    with op.batch_alter_table('runs') as batch:
        batch.drop_index(batch.f('ix_runs_team_id'))
        batch.drop_constraint(batch.f('fk_runs_team_id_teams'), type_='foreignkey')
        batch.drop_column('team_id')
    op.drop_index(op.f('ix_tokens_team_id'), table_name='tokens')
    op.drop_table('tokens')
    op.drop_table('teams')
