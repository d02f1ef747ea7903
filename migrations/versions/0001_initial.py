"""initial schema: runs, videos, work units, cost records

Revision ID: 0001
Revises: 
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('output', sa.Text(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('content_sha256', sa.String(length=64), nullable=False),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('name', name=op.f('uq_runs_name'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_content_sha256'), ['content_sha256'], unique=False)

    op.create_table('videos',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('line', sa.Integer(), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('negative_prompt', sa.Text(), nullable=True),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('height', sa.Integer(), nullable=False),
    sa.Column('frames', sa.Integer(), nullable=False),
    sa.Column('fps', sa.Integer(), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('guidance', sa.Float(), nullable=False),
    sa.Column('status', sa.Enum('pending', 'running', 'succeeded', 'failed', 'cancelled', name='status', native_enum=False, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('render_s', sa.Float(), nullable=True),
    sa.Column('encode_s', sa.Float(), nullable=True),
    sa.Column('upload_s', sa.Float(), nullable=True),
    sa.Column('uri', sa.Text(), nullable=True),
    sa.Column('bytes', sa.BigInteger(), nullable=True),
    sa.Column('sha256', sa.String(length=64), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_videos_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_videos')),
    sa.UniqueConstraint('run_id', 'key', name=op.f('uq_videos_run_id_key'))
    )
    with op.batch_alter_table('videos', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_videos_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_videos_status'), ['status'], unique=False)

    op.create_table('cost_records',
    sa.Column('video_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('rate_usd_per_hour', sa.Float(), nullable=False),
    sa.Column('rate_source', sa.Text(), nullable=False),
    sa.Column('amount_micro_usd', sa.BigInteger(), nullable=False),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['video_id'], ['videos.id'], name=op.f('fk_cost_records_video_id_videos'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_cost_records'))
    )
    with op.batch_alter_table('cost_records', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cost_records_video_id'), ['video_id'], unique=False)

    op.create_table('work_units',
    sa.Column('video_id', sa.Integer(), nullable=False),
    sa.Column('chunk', sa.Integer(), nullable=False),
    sa.Column('shape_key', sa.String(length=255), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('status', sa.Enum('pending', 'running', 'succeeded', 'failed', 'cancelled', name='status', native_enum=False, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_token', sa.BigInteger(), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['video_id'], ['videos.id'], name=op.f('fk_work_units_video_id_videos'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_work_units')),
    sa.UniqueConstraint('video_id', 'chunk', name=op.f('uq_work_units_video_id_chunk'))
    )
    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.create_index('ix_work_units_claim', ['status', 'priority', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_work_units_shape_key'), ['shape_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_work_units_video_id'), ['video_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_work_units_video_id'))
        batch_op.drop_index(batch_op.f('ix_work_units_shape_key'))
        batch_op.drop_index('ix_work_units_claim')

    op.drop_table('work_units')
    with op.batch_alter_table('cost_records', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_cost_records_video_id'))

    op.drop_table('cost_records')
    with op.batch_alter_table('videos', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_videos_status'))
        batch_op.drop_index(batch_op.f('ix_videos_run_id'))

    op.drop_table('videos')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_content_sha256'))

    op.drop_table('runs')
